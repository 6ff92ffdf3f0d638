"""speclane's orchestration layer: spec files, the stage graph, the executor, the engine, the server and the CLI.

Stages, models and kernels live in `stages/` and `kernels/`; this package knows stages only through the registry.
"""
