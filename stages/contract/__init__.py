"""The stage contract: Port, the stage registry, the errors a stage or model raises, the lane record, events.

The floor stages and models stand on: it imports nothing from `stages`, `pipeline` or `kernels`.
"""
