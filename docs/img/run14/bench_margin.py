"""`python -m speclane.bench` with the draft plan's MARGIN set: python bench_margin.py 1.15 --sections defaults ..."""
import sys
import speclane.stages.draft_plan as DP
DP.MARGIN = float(sys.argv[1])
print(f"draft plan MARGIN {DP.MARGIN}")
from speclane.bench.__main__ import main
sys.exit(main(sys.argv[2:]))
