"""dflash2's block pass: many blocks over one shared window (fitting) equal the same blocks run one by one."""

from __future__ import annotations

import torch

from speclane.stages.models.dflash2_net import DFlash2Config, DFlash2Net


def test_packed_blocks_equal_separate_blocks():
    torch.manual_seed(0)
    cfg = DFlash2Config(
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
        vocab_size=100,
        target_layers=(1, 2),
    )
    net = DFlash2Net(cfg)
    for p in net.parameters():
        p.data.normal_(0, 0.1)  # a fresh net's zero mask embedding and unit norms would hide mix-ups
    rows = 40
    feats = net.features(torch.randn(rows, 2, 64))
    k, v = net.context_kv(feats, torch.arange(rows))
    anchors = torch.tensor([3, 9, 10, 20, 33, 39])  # 9 and 10: neighbours whose windows differ by one
    mask = torch.arange(rows)[None] < anchors[:, None]
    emb = torch.randn(len(anchors), 64)
    window_k, window_v = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, layers, rows, kv]: shared
    packed = net.block(emb, feats[anchors - 1], anchors, window_k, window_v, mask)
    alone = torch.cat(
        [
            net.block(
                emb[i : i + 1], feats[anchors[i : i + 1] - 1], anchors[i : i + 1], window_k, window_v, mask[i : i + 1]
            )
            for i in range(len(anchors))
        ]
    )
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    # and a block must not see its neighbour's rows: change one block's anchor, the others stay put
    emb2 = emb.clone()
    emb2[2] = torch.randn(64)
    moved = net.block(emb2, feats[anchors - 1], anchors, window_k, window_v, mask)
    keep = torch.arange(len(anchors)) != 2
    torch.testing.assert_close(moved[keep], packed[keep], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(moved[2], packed[2])


def test_drafting_forms_equal_the_layer_by_layer_forms():
    """The window upkeep's drafting forms give what the plain forms give: every layer's keys and values in one
    product with one RoPE bit for bit; the taps' and the layers' norms through the row kernel up to the rounding of
    its float32 sums (a last bit, rarely), in bf16 and float32."""
    torch.manual_seed(1)
    cfg = DFlash2Config(
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
        vocab_size=100,
        target_layers=(1, 2, 3),
    )
    for dtype in (torch.bfloat16, torch.float32):
        tol = {"rtol": 2**-7, "atol": 1e-5} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-6}
        net = DFlash2Net(cfg)
        for p in net.parameters():
            p.data.normal_(0, 0.3)
        net = net.to(dtype)
        taps = (torch.randn(37, 3, 64) * torch.rand(37, 3, 1) * 40).to(dtype)  # rows of very different scale
        positions = torch.arange(37) * 7 + 3
        x = taps[:, 0]
        with torch.enable_grad():
            want_norm = net.hidden_norm(x).detach()
        with torch.no_grad():
            torch.testing.assert_close(net.hidden_norm(x), want_norm, **tol)
            tf = taps.float()
            normed = (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)).to(dtype)
            feats = net.features(taps)
            torch.testing.assert_close(feats, net.hidden_norm(net.fc(normed.flatten(1))), **tol)
            want_k, want_v = net.context_kv(feats, positions)  # layer by layer: not prepared yet
            net.prepare_drafting()
            assert net.window_kv is not None
            k, v = net.context_kv(feats, positions)
        assert k.shape == want_k.shape == (37, cfg.num_layers, 32) and v.shape == want_v.shape
        assert torch.equal(k, want_k) and torch.equal(v, want_v), dtype
