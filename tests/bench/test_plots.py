"""The bench plots from a small synthetic result (no model run), drawn with matplotlib's Agg backend: every plot
names the machine (CPU model, torch's CPU capability, the kernels' ISA), the code and the sample count; every point
measured more than once draws its spread from min to max; and a skipped peer or drafter is written in the plot with
its reason instead of being left out."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402

from speclane.bench import report_plots  # noqa: E402

LLAMA_SKIP = (
    "llama-cpp-python is not installed (No module named 'llama_cpp'); it is optional: "
    "pip install -e '.[bench-llamacpp]' (compiles llama.cpp, about 10 minutes)"
)
COMPUTE = (
    "CPU AVX512, 1 thread(s); decode route: C kernels (kernels/cpu/rows.c, avx512bf16); wide prefill GEMMs: "
    "native dtype"
)


def sp(median: float, lo: float, hi: float, n: int = 3) -> dict:
    return {"median": median, "min": lo, "max": hi, "n": n}


def row(backend: str, k: int, speedup: dict | None) -> dict:
    r = {"backend": backend, "k": k, "decode_tps": sp(10.0, 9.0, 11.0), "accepted_per_position": [0.9, 0.7, 0.5][:k]}
    return r | ({"speedup": speedup} if speedup else {})


def synthetic() -> dict:
    return {
        "machine": {
            "cpu": "Test CPU 9000",
            "commit": "abc1234+dirty",
            "cores": 2,
            "torch_threads": 1,
            "torch": "2.0",
            "dtype": "bfloat16",
            "compute": COMPUTE,
        },
        "command": "speclane bench --quick",
        "draft_tokens": {
            "prose": {
                "prompts": ["p1"],
                "skipped": {"dflash2": "no dflash2 drafter for this target"},
                "rows": {
                    "off": row("off", 0, None),
                    "ngram@1": row("ngram", 1, sp(1.2, 1.0, 1.5)),
                    "ngram@3": row("ngram", 3, sp(1.6, 1.1, 2.0)),
                },
            }
        },
        "lanes": {
            "workload": "prose",
            "skipped": {},
            "rows": [
                {"lanes": 1, "config": "off"},
                {"lanes": 1, "config": "rows=3", "speedup": sp(1.5, 1.2, 1.9)},
                {"lanes": 2, "config": "rows=3", "speedup": sp(1.3, 1.25, 1.4)},
            ],
        },
        "lengths": {
            "256": {"skipped": {}, "rows": {"off": {}, "ngram@3": {"speedup": {"8": sp(1.4, 1.1, 1.8)}}}},
            "1k": {"skipped": {}, "rows": {"off": {}, "ngram@3": {"speedup": {"8": sp(1.7, 1.5, 2.2)}}}},
        },
        "peers": {
            "skipped": {"llama.cpp": LLAMA_SKIP},
            "notes": {"llama.cpp-q4_1": "model.Q4_1.gguf: weights Q4_1, the GGUF as shipped"},
            "lookup": 3,
            "prose": {"speclane": {"decode_tps": sp(40.0, 35.0, 48.0)}, "transformers": {"decode_tps": sp(15, 12, 16)}},
        },
    }


def text_of(fig) -> str:
    """Every text the figure draws outside its axes, whitespace collapsed (the footer wraps at spaces)."""
    return " ".join(" ".join(t.get_text() for t in fig.texts).split())


@pytest.fixture
def figures():
    import matplotlib.pyplot as plt

    figs = report_plots.figures(synthetic())
    yield figs
    for fig in figs.values():
        plt.close(fig)


def test_every_plot_is_stamped_with_machine_code_and_samples(figures):
    assert set(figures) == {
        "speedup_vs_draft_tokens.png",
        "acceptance_per_position.png",
        "speedup_vs_lanes.png",
        "speedup_vs_prompt_length.png",
        "peers.png",
    }
    for name, fig in figures.items():
        text = text_of(fig)
        for needed in ("Test CPU 9000", "CPU AVX512", "avx512bf16", "commit abc1234+dirty", "n=3 per point"):
            assert needed in text, (name, needed, text)


def test_a_skipped_peer_and_drafter_are_said_in_the_plot(figures):
    peers = text_of(figures["peers.png"])
    assert f"llama.cpp: skipped ({LLAMA_SKIP})" in peers
    assert "llama.cpp-q4_1: model.Q4_1.gguf: weights Q4_1, the GGUF as shipped" in peers  # how a peer ran
    assert "dflash2 on prose: skipped (no dflash2 drafter for this target)" in text_of(
        figures["speedup_vs_draft_tokens.png"]
    )


def bars_span(ax) -> list[tuple[float, float]]:
    """(bottom, top) of every error bar the axes draw."""
    spans = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            for coll in c[2]:
                spans += [(min(s[0][1], s[1][1]), max(s[0][1], s[1][1])) for s in coll.get_segments()]
    return spans


@pytest.mark.parametrize(
    "name, spans",
    [
        ("speedup_vs_draft_tokens.png", {(1.0, 1.5), (1.1, 2.0)}),
        ("speedup_vs_lanes.png", {(1.2, 1.9), (1.25, 1.4)}),
        ("speedup_vs_prompt_length.png", {(1.1, 1.8), (1.5, 2.2)}),
        ("peers.png", {(35.0, 48.0), (12.0, 16.0)}),
    ],
)
def test_repeated_points_draw_their_spread_from_min_to_max(figures, name, spans):
    (ax,) = figures[name].axes
    assert {(round(lo, 6), round(hi, 6)) for lo, hi in bars_span(ax)} == spans


def test_peers_are_bars_with_error_bars(figures):
    (ax,) = figures["peers.png"].axes
    assert any(isinstance(c, BarContainer) for c in ax.containers)
    assert [round(p.get_height(), 6) for p in ax.patches] == [40.0, 15.0]


def test_acceptance_says_it_is_pooled_without_spread(figures):
    assert "no per-run spread" in text_of(figures["acceptance_per_position.png"])


def test_a_peers_section_with_every_peer_skipped_still_says_why():
    import matplotlib.pyplot as plt

    res = synthetic()
    res["peers"] = {"skipped": {"llama.cpp": LLAMA_SKIP, "transformers": "ImportError: no torch"}, "notes": {}}
    fig = report_plots.figures(res)["peers.png"]
    text = text_of(fig)
    plt.close(fig)
    assert "llama.cpp: skipped" in text and "transformers: skipped (ImportError: no torch)" in text


@pytest.mark.parametrize(
    "commit, said",
    [("abc1234", "commit abc1234"), ("speclane 0.1.0", "speclane 0.1.0"), ("unknown", "commit not recorded")],
)
def test_the_code_is_a_commit_or_the_package_version(commit, said):
    assert report_plots.code_of({"commit": commit}) == said
    assert report_plots.code_of({}) == "commit not recorded"


def test_plots_writes_one_png_per_figure(tmp_path):
    written = report_plots.plots(synthetic(), tmp_path / "img")
    assert sorted(p.name for p in written) == sorted(p.name for p in (tmp_path / "img").iterdir())
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
