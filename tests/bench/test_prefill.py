"""bench.prefill end to end with tiny settings: every configuration runs and prints its line (no timing asserts)."""
from bench import prefill


def test_prefill_bench_runs_every_configuration(capsys):
    assert prefill.main(["--lengths", "70", "--chunk", "64", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "CPU " in out and "chunks of 64 rows" in out
    for name in ("speclane ", "speclane rows-attention", "transformers"):
        assert f"70 tokens  {name}" in out, out
