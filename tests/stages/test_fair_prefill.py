"""The serve's default step budget of prompt rows follows the machine's pass-cost table: the most rows (up to the
cap) whose pass costs at most FAIR_PASS one-row passes, so a step that prefills never delays the decoding lanes by
more than that, whatever a row costs in the dtype at hand."""

from __future__ import annotations

import pytest

from speclane.stages.models import pass_cost


def _table(monkeypatch, ratios):
    rows = pass_cost.probe_rows(64)[: len(ratios)]

    def fake(target, costs, most):
        costs.set_probe(rows, tuple(0.01 * r for r in ratios), "test")

    monkeypatch.setattr(pass_cost, "pass_costs", fake)


@pytest.mark.parametrize(
    "ratios, want",
    [
        ((1.0, 1.0, 1.05, 1.1, 1.12, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5), 16),  # rows nearly free: the cap
        ((1.0, 1.1, 1.14, 1.31, 1.93, 2.16, 2.47, 3.33, 4.35, 4.68, 6.38), 4),  # dear rows: few
        ((1.0, 1.6, 2.0), 1),  # even two rows too dear: one
    ],
)
def test_the_budget_is_the_most_rows_within_the_fair_cost(monkeypatch, ratios, want):
    _table(monkeypatch, ratios)
    assert pass_cost.fair_prefill_rows(object(), most=16) == want


def test_the_cap_holds_even_where_more_rows_would_fit(monkeypatch):
    _table(monkeypatch, (1.0,) * 11)
    assert pass_cost.fair_prefill_rows(object(), most=8) == 8
