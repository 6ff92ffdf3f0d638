"""The house style's "Small rooms": one concept per module, about 300 lines at most. This keeps the budget honest."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 300


def test_every_module_fits_in_a_head():
    big = {}
    for package in ("pipeline", "stages", "kernels", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            lines = len(path.read_text().splitlines())
            if lines > LIMIT:
                big[str(path.relative_to(ROOT))] = lines
    assert not big, f"modules over {LIMIT} lines (split where a second concept hides): {big}"
