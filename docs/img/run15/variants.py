"""The plan variants sim.py compares (each sets draft_plan's constants before its engine is built). The fifteenth
session also ran run14's lane-values.diff with the other lanes' value taken from the probe (n * per-row cost / the
n-row pass: 0.19 at 4 lanes, 0.42 at 8 on this probe): identical to base at 4 and 8 lanes, 0.992 against 0.991 at 2."""
def base(DP): pass
def m115(DP): DP.MARGIN = 1.15
VARIANTS = {"base": base, "m115": m115}
