"""The runtime: the engine (admission, the round loop), requests and --spec-* knobs, machine profiles.

It runs the framework's plans; it never names a stage, a kind or a drafter.
"""
