"""Train/serve agreement (issue 18): what fitting computes for an anchor is what the engine proposes from.

One sequence per lane, run through the tiny float32 target once; the fitting side reads it as a fitting sequence
(`fit_losses`), the serving side drives the backend as the engine does: a prefill in two passes of different
lanes, then verify rounds whose rows are the anchor, some correct drafts and some junk (rejected rows with taps
that are not the sequence's), each lane committing a different number. Before every round the backend proposes,
and its block states (dflash2) or its chain's head inputs (mtp) must equal the fitting path's for that anchor:
the same visible window positions, the same carried feature, the same RoPE positions, the same embeddings. The
window holds 16 positions, so the rounds run past its end. An off-by-one anywhere moves these states by O(1).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from speclane.kernels import cpu_build
from speclane.stages.fitting import losses as fit_losses
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.state import RowBatch
from tests.models.target_artifacts import prompt
from tests.round.conftest import engine

WINDOW = 16
# float32 throughout; the window's keys are projected in other groupings than fitting's one product, so the
# sums round differently: 1e-4 is far below the O(1) moves of a wrong position or feature.
TOL = dict(rtol=1e-4, atol=1e-4)


class Lane:
    def __init__(self, slot, kv_len, seq):
        self.slot, self.kv_len, self.seq = slot, kv_len, seq

    @property
    def tokens(self) -> list[int]:
        """Prompt and output so far, the anchor last (what prompt lookup reads)."""
        return self.seq[: self.kv_len + 1]


def _drafter_dir(tiny, backend, tmp_path, version=None):
    """Random drafter files with nothing left at its trivial init (zero mask embedding, unit norms)."""
    torch.manual_seed(1)
    net = dw.new_net(backend, tiny.cfg, **({"version": version} if version else {}))
    for p in net.parameters():
        p.data.normal_(0, 0.3)
    net.cfg = net.cfg.model_copy(update={"window": WINDOW})
    dw.export(backend, net, tmp_path, {"test": "train/serve"}, {})
    return tmp_path


def _full_pass(tiny, tokens):
    """Every row of the sequence through the target at once: taps [L, n, hidden], hidden [L, hidden]."""
    state = tiny.new_state(1, len(tokens) + 1)
    out = tiny.forward(RowBatch.build([(0, 0, tokens)]), state, record="last", logits="all")
    return out.taps, out.hidden


def _drive(backend, seqs, record, rounds):
    """Prefill both lanes in two passes, then `rounds` verify rounds; `record(lanes, anchors)` is called around
    each proposal. Returns the proposals' count."""
    state = backend.new_state(len(seqs), 512)
    lanes = [Lane(i, 0, s["tokens"]) for i, s in enumerate(seqs)]
    gen = torch.Generator().manual_seed(5)

    def observe(parts):
        """parts: (lane, rows' tokens, rows' taps, rows' hidden, committed)."""
        batch = RowBatch.build([(lane.slot, lane.kv_len, toks) for lane, toks, *_ in parts])
        out = SimpleNamespace(taps=torch.cat([p[2] for p in parts]), hidden=torch.cat([p[3] for p in parts]))
        backend.observe(state, [p[0] for p in parts], batch, out, torch.tensor([p[4] for p in parts]))
        for lane, toks, *_, keep in parts:
            lane.kv_len += keep

    def rows(i, a, b):
        s = seqs[i]
        return s["tokens"][a:b], s["all_taps"][a:b], s["hidden"][a:b]

    first = [s["start"] - 7 for s in seqs]  # prefill: lane 0's first part with all of lane 1, then lane 0's rest
    observe([(lanes[0], *rows(0, 0, first[0]), first[0]), (lanes[1], *rows(1, 0, seqs[1]["start"]), seqs[1]["start"])])
    observe([(lanes[0], *rows(0, first[0], seqs[0]["start"]), seqs[0]["start"] - first[0])])
    for r in range(rounds):
        anchors = torch.tensor([seqs[lane.slot]["tokens"][lane.kv_len] for lane in lanes])
        record(lanes, anchors)
        backend.propose(lanes, anchors, [7] * len(lanes), state)
        parts = []
        for lane in lanes:
            accepted = (r + 2 * lane.slot) % 4  # 0..3 drafts committed, lanes differ
            toks, taps, hidden = rows(lane.slot, lane.kv_len, lane.kv_len + 1 + accepted)
            junk = 3  # rejected rows: other tokens, other states
            toks = toks + torch.randint(0, 50, (junk,), generator=gen).tolist()
            taps = torch.cat([taps, torch.randn(junk, *taps.shape[1:], generator=gen)])
            hidden = torch.cat([hidden, torch.randn(junk, hidden.shape[1], generator=gen)])
            parts.append((lane, toks, taps, hidden, 1 + accepted))
        observe(parts)
    return rounds


def _sequences(tiny, lengths):
    seqs = []
    for i, (n, start) in enumerate(lengths):
        tokens = prompt(n, seed=900 + i)
        tokens[n // 2 :] = tokens[3 : 3 + n - n // 2]  # the answer repeats the prompt: prompt lookup finds copies
        taps, hidden = _full_pass(tiny, tokens)
        seqs.append(
            {
                "tokens": tokens,
                "start": start,
                "all_taps": taps,
                "hidden": hidden,
                "fit": {"tokens": torch.tensor(tokens, dtype=torch.int32), "taps": taps[:-1], "start": start},
            }
        )
    return seqs


def test_the_fitting_taps_end_with_the_state_mtp_reads(tiny):
    """Tap i is decoder layer i's output (an off-by-one against the embedding output silently lowers acceptance), so
    the last fitting tap is `PassOutput.hidden`."""
    taps = tiny.hidden_taps
    tiny.hidden_taps = dw.fit_taps(tiny.cfg)
    try:
        all_taps, hidden = _full_pass(tiny, prompt(20, seed=3))
    finally:
        tiny.hidden_taps = taps
    assert dw.fit_taps(tiny.cfg)[-1] == tiny.cfg.num_layers - 1
    torch.testing.assert_close(all_taps[:, -1], hidden, rtol=0, atol=0)


@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_dflash2_proposes_from_the_block_it_was_fitted_on(tiny, tmp_path, monkeypatch, version):
    """Version 2 (the fifth session's file: entry q = row q's feature), 3 (entry q = row q - 1's feature +
    token q, the carry chained across passes), 4 (the block input fused) and 5 (prompt lookup's candidates in the
    block rows: looked up over the lane's tokens at serving, over the sequence up to the anchor in fitting)."""
    directory = _drafter_dir(tiny, "dflash2", tmp_path, version)
    eng = engine(tiny, "dflash2", k=7, max_lanes=2, options={"path": str(directory)})
    backend, net = eng.drafter, eng.drafter.net
    assert net.cfg.window == WINDOW and backend.window == WINDOW and net.cfg.version == version
    seqs = _sequences(tiny, [(70, 20), (60, 13)])
    served, fitted, block, in_place, one_call = [], [], net.block, backend._block_in_place, []

    def record(lanes, anchors):
        monkeypatch.setattr(net, "block", block)  # the fitting side's own call is not recorded
        for lane in lanes:
            s = seqs[lane.slot]["fit"]
            fitted.append(fit_losses._dflash2_states(net, s, tiny.weights.embed, torch.tensor([lane.kv_len]))[0])
        monkeypatch.setattr(net, "block", lambda *a: served.append(block(*a)) or served[-1])
        monkeypatch.setattr(  # the one-call route (stages/models/draft_route.py), where the C kernels serve
            backend, "_block_in_place", lambda *a: one_call.append(1) or served.append(in_place(*a)) or served[-1]
        )

    rounds = _drive(backend, seqs, record, rounds=9)
    assert len(served) == rounds
    assert (len(one_call) == rounds) == (cpu_build.library() is not None)
    got = torch.cat(served)  # [rounds * lanes, S, hidden]
    torch.testing.assert_close(got, torch.stack(fitted), **TOL)
    if version >= 5:  # the candidates were there to agree on, and they move the rows
        cand, _ = fit_losses.seq_lookup(seqs[0]["fit"], net.cfg)
        assert (cand[seqs[0]["start"] :] >= 0).float().mean() > 0.5
        key = ("lookup", net.cfg.lookup_min_n, net.cfg.lookup_max_n, 7)
        blind = {**seqs[0]["fit"], key: (torch.full_like(cand, -1), torch.zeros_like(cand))}
        at = torch.tensor([len(seqs[0]["tokens"]) - 12])  # inside the copy
        lane0 = fit_losses._dflash2_states(net, blind, tiny.weights.embed, at)
        with_lookup = fit_losses._dflash2_states(net, seqs[0]["fit"], tiny.weights.embed, at)
        assert (lane0 - with_lookup)[0, 1:].abs().max() > 0.1


def test_mtp_proposes_from_the_chain_it_was_fitted_on(tiny, tmp_path, monkeypatch):
    """The drafts are forced to the sequence's own next tokens (an oracle in place of the head's argmax), so the
    chain at serving is the teacher-forced chain fitting runs: every step's head input must agree."""
    options = {"path": str(_drafter_dir(tiny, "mtp", tmp_path)), "lookup_trust": 0}  # the head's own steps only
    eng = engine(tiny, "mtp", k=7, max_lanes=2, options=options)
    backend, net = eng.drafter, eng.drafter.net
    seqs = _sequences(tiny, [(70, 20), (60, 13)])
    served, fitted, now = [], [], {}
    head_in = net.head_in

    def oracle(x, weight):  # one-hot logits of each lane's true next token
        d = len(served) - 1 - now["first"]
        want = torch.tensor([seqs[lane.slot]["tokens"][lane.kv_len + 1 + d] for lane in now["lanes"]])
        return torch.nn.functional.one_hot(want, weight.shape[0]).float()

    monkeypatch.setattr("speclane.stages.drafters.model_backend.proposal_logits", oracle)

    def record(lanes, anchors):
        monkeypatch.setattr(net, "head_in", head_in)  # the fitting side's own calls are not recorded
        now.update(lanes=lanes, first=len(served))
        states = []
        for lane in lanes:
            s = dict(seqs[lane.slot]["fit"], taps=seqs[lane.slot]["hidden"][:-1, None])
            states.append(fit_losses._mtp_chain(net, s, tiny.weights.embed, 7, torch.tensor([lane.kv_len - 1]))[:, 0])
        fitted.append(torch.stack(states, dim=1))  # [depth, lanes, hidden]
        monkeypatch.setattr(net, "head_in", lambda s: served.append(head_in(s)) or served[-1])

    _drive(backend, seqs, record, rounds=9)
    got = torch.stack(served).reshape(len(fitted), 7, 2, -1)
    torch.testing.assert_close(got, torch.stack(fitted), **TOL)


def test_dflash2_drafts_what_a_long_lookup_match_finds(tiny, tmp_path):
    """`lookup_trust`: where prompt lookup's matched suffix is at least that long, the drafts are lookup's tokens;
    elsewhere (and with 0, everywhere) the network's."""
    from speclane.stages.models.lookup import LookupIndex, lookup

    directory = _drafter_dir(tiny, "dflash2", tmp_path, 5)
    proposals, seqs = {}, None
    for trust in (0, 2):
        backend = engine(
            tiny, "dflash2", k=7, max_lanes=2, options={"path": str(directory), "lookup_trust": trust}
        ).drafter
        seqs = seqs or _sequences(tiny, [(70, 20), (60, 13)])  # the taps the engine declared
        real, got = backend.propose, []

        def propose(lanes, *rest, real=real, got=got):
            found = [lookup(lane.tokens, LookupIndex(), 7, 1, 4) for lane in lanes]
            got.append((found, real(lanes, *rest).drafts))
            return got[-1][1]

        backend.propose = propose
        _drive(backend, seqs, lambda lanes, anchors: None, rounds=14)  # well into the answers' copies
        proposals[trust] = got
    trusted = moved = 0
    for (found, net), (_, ours) in zip(proposals[0], proposals[2]):
        for i, (tokens, n) in enumerate(found):
            if n >= 2:
                assert ours[i, : len(tokens)].tolist() == tokens
                assert torch.equal(ours[i, len(tokens) :], net[i, len(tokens) :])
                trusted += 1
                moved += ours[i, : len(tokens)].tolist() != net[i, : len(tokens)].tolist()
            else:
                assert torch.equal(ours[i], net[i])
    assert trusted >= 6 and moved >= 3  # the copy was found, and the random network did not draft it itself
    with pytest.raises(ValueError, match="lookup_trust must be an integer >= 0"):
        engine(tiny, "dflash2", k=7, max_lanes=2, options={"path": str(directory), "lookup_trust": -1})
