"""dflash2's block input (issue 18): a freshly drawn drafter must not start out proposing its own anchor.

The target's output head is its embedding (tied, as in the default model and the tiny llama), so a block row that
holds the anchor's normed embedding as it is (versions 2 and 3 add it, unprojected, to every row) scores the anchor
far above every other token before any fitting: on the default model a fresh version 2 drafter proposed the anchor
itself for 75 % of held-out first drafts, at a row-1 cross-entropy of 46.3 nats against ln(49,152) = 10.8 for a
uniform guess (docs/decisions/0006-dflash2-fused-block-input.md), and the first hundreds of fitting steps went to
unlearning it (0.119 first-draft acceptance at step 200 against mtp's 0.146).
Version 4 projects [anchor | carried feature] with a learned `block_fc`, as mtp fuses its pair, so the fit starts
near uniform (version 4: 0.159 at step 200 on the same control).
"""

import pytest
import torch

from speclane.stages.fitting import data as fit_data
from speclane.stages.fitting import losses as fit_losses
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.draft_layer import rope
from tests.models.target_artifacts import prompt


@pytest.fixture(scope="module")
def seqs(tiny):
    taps = tiny.hidden_taps
    tiny.hidden_taps = dw.fit_taps(tiny.cfg)
    try:
        texts = [prompt(40, seed=700 + i) for i in range(6)]
        out = fit_data.forced(tiny, [("code", t[:8], t) for t in texts])
    finally:
        tiny.hidden_taps = taps
    for q in out:
        q["taps"] = q["taps"].float()
    return out


def _fresh_anchor_prob(tiny, seqs, version):
    """Mean probability a freshly drawn drafter's block row 1 gives its own anchor, and how often it is the draft."""
    torch.manual_seed(0)
    net = dw.new_net("dflash2", tiny.cfg, version=version).eval()
    embed, head = tiny.weights.embed.float(), tiny.weights.lm_head.float()
    probs, drafted = [], []
    with torch.no_grad():
        for q in seqs:
            anchors = fit_losses.answer_anchors(q, 1)
            logits = fit_losses._dflash2_states(net, q, embed, anchors)[:, 1] @ head.T
            own = q["tokens"].long()[anchors]
            probs.append(torch.softmax(logits, -1).gather(1, own[:, None])[:, 0])
            drafted.append(logits.argmax(-1) == own)
    return float(torch.cat(probs).mean()), float(torch.cat(drafted).float().mean())


def test_the_tiny_head_is_tied(tiny):
    assert torch.equal(tiny.weights.embed, tiny.weights.lm_head)  # the case the fix is about


def test_a_fresh_drafter_does_not_propose_its_anchor(tiny, seqs):
    prob, drafted = _fresh_anchor_prob(tiny, seqs, dw.new_net("dflash2", tiny.cfg).cfg.version)
    vocab = tiny.cfg.vocab_size
    assert prob < 5 / vocab and drafted < 0.2, (prob, drafted)


def test_the_summed_block_input_does(tiny, seqs):
    """The old layout fails the bar above: the test can tell the two apart."""
    prob, drafted = _fresh_anchor_prob(tiny, seqs, 2)
    assert prob > 5 / tiny.cfg.vocab_size and drafted > 0.5, (prob, drafted)


def test_version_4_files_carry_block_fc_and_older_versions_load_without_it(tiny, tmp_path):
    """And version 5 files carry prompt lookup's projection and length embeddings besides."""
    from safetensors.torch import load_file, save_file

    from speclane.stages.contract.errors import ArtifactError

    for version in (2, 4, 5):
        torch.manual_seed(0)
        net = dw.new_net("dflash2", tiny.cfg, version=version)
        dw.export("dflash2", net, tmp_path / str(version), {"test": True})
        got, _ = dw.load("dflash2", *dw.files("dflash2", tmp_path / str(version)), tiny.cfg, torch.float32, "cpu")
        assert got.cfg.version == version and hasattr(got, "block_fc") == (version >= 4)
        assert hasattr(got, "lookup_fc") == hasattr(got, "lookup_embedding") == (version == 5)
    weights, config = dw.files("dflash2", tmp_path / "4")
    tensors = load_file(weights)
    del tensors["block_fc.weight"]
    save_file(tensors, weights)
    with pytest.raises(ArtifactError, match=r"tensor 'block_fc.weight' is missing \(expected shape \[42, 84\]\)"):
        dw.load("dflash2", weights, config, tiny.cfg, torch.float32, "cpu")
    config.write_text(config.read_text().replace('"version": 4', '"version": 6'))
    with pytest.raises(
        ArtifactError, match=r"(?s)dflash2.json: not a valid dflash2 config .*version.*Input should be 2, 3, 4 or 5"
    ):
        dw.load("dflash2", weights, config, tiny.cfg, torch.float32, "cpu")


def test_a_version_4_drafter_goes_on_fitting_as_version_5_unchanged(tiny):
    """`fit-drafter --init` of a version 4 file makes version 5 (`dw.upgrade`): the lookup tensors start at zero,
    so the upgraded drafter's block states equal the old one's whatever the candidates, and they are trainable.
    A layout that cannot be carried over is refused."""
    from speclane.stages.contract.errors import ArtifactError

    torch.manual_seed(0)
    old = dw.new_net("dflash2", tiny.cfg, version=4)
    new = dw.upgrade(old, 5)
    assert new.cfg.version == 5 and not new.lookup_fc.weight.detach().any() and not new.lookup_embedding.detach().any()
    assert new.lookup_fc.weight.requires_grad and new.lookup_embedding.requires_grad
    h, b = tiny.cfg.hidden_size, 3
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(b, old.cfg.num_layers, 12, old.kv_dim, generator=gen)
    args = (
        torch.randn(b, h, generator=gen),
        torch.randn(b, h, generator=gen),
        torch.tensor([4, 9, 12]),
        k,
        torch.randn_like(k),
        torch.ones(b, 12, dtype=torch.bool),
    )
    cand = torch.randint(0, tiny.cfg.vocab_size, (b, 7), generator=gen)
    level = torch.randint(0, 5, (b, 7), generator=gen)
    with torch.no_grad():
        before = old.block(*args)
        after = new.block(*args, new.lookup_input(tiny.weights.embed.float(), torch.where(level > 0, cand, -1), level))
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    with pytest.raises(ArtifactError, match="version 2 file cannot go on fitting as version 5"):
        dw.upgrade(dw.new_net("dflash2", tiny.cfg, version=2), 5)


@pytest.mark.parametrize("backend", ["dflash2", "mtp"])
def test_fused_drafting_weights_change_nothing(tiny, backend):
    """`prepare_drafting` (the backends call it at load) fuses q|k|v and gate|up into one weight each: a
    proposal's states and a window's keys are the same as through the separate projections, the projections keep
    their names and shapes as views of the fused weights, and memory holds one copy (dflash2 adds one: every
    layer's keys and values stacked for the window upkeep, counted)."""
    torch.manual_seed(0)
    net = dw.new_net(backend, tiny.cfg).eval().requires_grad_(False)
    before_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    layer = net.layers[0] if backend == "dflash2" else net.layer
    h, s, m = tiny.cfg.hidden_size, 8, 12
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, s, h, generator=gen)
    cos, sin = rope(torch.arange(s)[None].expand(2, s) + 20, tiny.cfg.head_dim, 10000.0)
    ext_k, ext_v = torch.randn(2, m, net.kv_dim, generator=gen), torch.randn(2, m, net.kv_dim, generator=gen)
    args = (x, cos, sin, ext_k, ext_v, torch.rand(2, s, m, generator=gen) > 0.3, torch.ones(s, s, dtype=torch.bool))
    names = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    with torch.no_grad():
        want = layer(*args)
        feats = torch.randn(5, h, generator=gen)
        want_kv = net.context_kv(feats, torch.arange(5) + 3) if backend == "dflash2" else None
        net.prepare_drafting()
        got = layer(*args)
    assert layer.qkv is not None and layer.self_attn.q_proj.weight.data_ptr() == layer.qkv.data_ptr()
    assert {k: tuple(v.shape) for k, v in net.state_dict().items()} == names
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    extra = net.window_kv.numel() * net.window_kv.element_size() if backend == "dflash2" else 0
    assert net.memory_bytes() == before_bytes + extra
    if backend == "dflash2":
        with torch.no_grad():
            got_kv = net.context_kv(feats, torch.arange(5) + 3)
        for a, b in zip(got_kv, want_kv):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
