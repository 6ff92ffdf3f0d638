"""The plan variants docs/img/run15/sim.py compared this session (copy this file beside sim.py as variants.py):
`old` is the plan before lane_values (every token worth one, lanes still prefilling not weighed), `new` the shipped
one, `wonly` only the prefilling lanes weighed. usage: python sim.py BACKEND old,new,wonly 1 2 4 8"""
def new(DP): pass
def old(DP): DP.OTHER_VALUE, DP.WAITING_WEIGHT = 1.0, 0.0
def wonly(DP): DP.OTHER_VALUE = 1.0
VARIANTS = {"new": new, "old": old, "wonly": wonly}
