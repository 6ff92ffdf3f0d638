"""Drafter fitting, apart from serving: data from the target (`data`), losses (`losses`), the loop (`fit`).

It uses the models and kernels; nothing that serves a request imports it (the CLI's `fit-drafter` does).
"""
