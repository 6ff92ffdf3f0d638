"""The `none` backend: proposes nothing, so the verify round is the plain decode round."""

from __future__ import annotations

from speclane.stages.drafters.base import DraftBackend, empty_proposal


class NoDrafts(DraftBackend):
    name = "none"
    proposes = False

    def propose(self, lanes, anchors, limits, state):
        return empty_proposal(len(lanes), anchors.device)


BACKEND = NoDrafts
