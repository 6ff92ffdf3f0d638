"""speclane's upper floors, top down: front doors (`cli`, `net`), the runtime (`runtime`: engine, requests,
profiles) and the graph framework (`framework`: spec files, graphs, the executor). Stages, models and kernels
live in `stages/` and `kernels/` below; this package knows stages only through the registry. docs/architecture.md
draws the floors.
"""
