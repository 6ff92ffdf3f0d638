"""The stage kinds of a round, one module per kind, registered by `kind`; models live in `stages.models`.

Floors inside: `stages/contract` (ports, registry, errors, the lane record) at the bottom with `kernels`, then
`stages/models`, then `stages/drafters` and the stage modules; `stages/fitting` stands apart (serving never imports it).
"""

# The modules that register the built-in stage kinds; the framework imports them when it first looks up a kind.
BUILTIN_STAGES = (
    "stages.anchor_gather", "stages.draft", "stages.target_pass", "stages.accept", "stages.kv_commit",
    "stages.drafter_commit", "stages.recurrent_replay", "stages.stream_emit", "stages.prefill_gather",
)
