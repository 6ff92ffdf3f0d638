"""The stage kinds of a round, one module per kind, registered by `kind`; models live in `speclane.stages.models`.

Floors inside: `stages/contract` (ports, registry, errors, the lane record) at the bottom with `kernels`, then
`stages/models`, then `stages/drafters` and the stage modules; `stages/fitting` stands apart (serving never imports it).
"""

# The modules that register the built-in stage kinds; the framework imports them when it first looks up a kind.
BUILTIN_STAGES = (
    "speclane.stages.anchor_gather",
    "speclane.stages.draft",
    "speclane.stages.target_pass",
    "speclane.stages.accept",
    "speclane.stages.kv_commit",
    "speclane.stages.drafter_commit",
    "speclane.stages.recurrent_replay",
    "speclane.stages.stream_emit",
    "speclane.stages.prefill_gather",
)
