"""The graph framework: spec files, finding stage kinds, building and validating graphs, the executor,
introspection and spec editing. It knows stages only through the contract and the registry; nothing here names
a stage kind, a drafter or a request.
"""
