"""The head a model drafter proposes through: an int8 copy of the target's head where the C kernels read int8
(drafts are verified, never compared bit for bit), the target's own int8 head under --quant int8, the head itself
without the kernels; and the proposals read it."""

import torch

from speclane.kernels import cpu_build
from speclane.kernels.quant import Int8Weight
from speclane.stages.drafters import model_backend
from speclane.stages.drafters.model_backend import draft_head
from speclane.stages.models.target import Target
from tests.drafters.conftest import write_drafter
from tests.drafters.test_loading import backend


def test_an_int8_copy_where_the_c_kernels_read_int8(tiny):
    head = draft_head(tiny)
    if cpu_build.library() is None:
        assert head is tiny.weights.lm_head
        return
    assert isinstance(head, Int8Weight) and head.shape == tiny.weights.lm_head.shape
    torch.testing.assert_close(
        head.dequantize(torch.float32),
        tiny.weights.lm_head,
        rtol=0,
        atol=float(tiny.weights.lm_head.abs().max()) / 254 + 1e-7,
    )


def test_the_torch_route_keeps_the_head(tiny, no_cpu_kernels):
    assert draft_head(tiny) is tiny.weights.lm_head


def test_a_quantized_target_lends_its_own_head(artifacts):
    target = Target.load(artifacts["llama"][0], dtype=torch.float32, quant="int8")
    assert draft_head(target) is target.weights.head


def test_proposals_go_through_the_draft_head(tiny, tmp_path, monkeypatch):
    write_drafter("mtp", tiny, tmp_path)
    mtp = backend("mtp", tiny, tmp_path)
    seen = []
    real = model_backend.proposal_logits
    monkeypatch.setattr(model_backend, "proposal_logits", lambda x, w: seen.append(w) or real(x, w))
    state = mtp.new_state(1, 64)
    lane = type("L", (), {"slot": 0, "kv_len": 0, "tokens": [3]})()
    mtp.propose([lane], torch.tensor([3]), [2], state)
    assert seen and all(w is mtp.draft_head for w in seen)
