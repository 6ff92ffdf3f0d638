"""speclane.bench.prefill end to end with tiny settings: every configuration runs and prints its line (no timing
asserts)."""

from speclane.bench import prefill
from speclane.kernels import cpu_build
from speclane.kernels.decode_attention import serves_wide


def test_prefill_bench_runs_every_configuration(capsys):
    assert prefill.main(["--lengths", "70", "--chunk", "64", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "CPU " in out and "chunks of 64 rows" in out
    other = "speclane sdpa" if serves_wide(64) else "speclane rows-attention"  # the route the engine does not take
    names = ("speclane ", other, "transformers") if cpu_build.library() is not None else ("speclane ", "transformers")
    for name in names:
        assert f"70 tokens  {name}" in out, out
