"""dflash2's block pass: many blocks over one shared window (fitting) equal the same blocks run one by one."""
from __future__ import annotations

import torch

from stages.models.dflash2_net import DFlash2Config, DFlash2Net


def test_packed_blocks_equal_separate_blocks():
    torch.manual_seed(0)
    cfg = DFlash2Config(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                        vocab_size=100, target_layers=(1, 2))
    net = DFlash2Net(cfg)
    for p in net.parameters():
        p.data.normal_(0, 0.1)   # a fresh net's zero mask embedding and unit norms would hide mix-ups
    rows = 40
    feats = net.features(torch.randn(rows, 2, 64))
    k, v = net.context_kv(feats, torch.arange(rows))
    anchors = torch.tensor([3, 9, 10, 20, 33, 39])           # 9 and 10: neighbours whose windows differ by one
    mask = torch.arange(rows)[None] < anchors[:, None]
    emb = torch.randn(len(anchors), 64)
    window_k, window_v = k.transpose(0, 1)[None], v.transpose(0, 1)[None]   # [1, layers, rows, kv]: shared
    packed = net.block(emb, feats[anchors - 1], anchors, window_k, window_v, mask)
    alone = torch.cat([net.block(emb[i:i + 1], feats[anchors[i:i + 1] - 1], anchors[i:i + 1], window_k, window_v,
                                 mask[i:i + 1]) for i in range(len(anchors))])
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    # and a block must not see its neighbour's rows: change one block's anchor, the others stay put
    emb2 = emb.clone()
    emb2[2] = torch.randn(64)
    moved = net.block(emb2, feats[anchors - 1], anchors, window_k, window_v, mask)
    keep = torch.arange(len(anchors)) != 2
    torch.testing.assert_close(moved[keep], packed[keep], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(moved[2], packed[2])
