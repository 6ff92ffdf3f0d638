"""The stage kinds of a round, one module per kind, registered by `kind`; models live in `stages.models`."""
