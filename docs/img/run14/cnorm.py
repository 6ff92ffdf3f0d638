import time, torch, statistics
import torch.nn.functional as F
from speclane.kernels.rowwise import add_rms_norm
torch.set_num_threads(1); torch.set_grad_enabled(False)
def t(f, n=15):
    f(); xs = []
    for _ in range(n):
        a = time.perf_counter(); f(); xs.append(time.perf_counter() - a)
    return statistics.median(xs) * 1e3
one = torch.ones(576)
for R in (4, 64, 256, 841):
    taps = (torch.randn(R, 5, 576) * torch.rand(R, 5, 1) * 30).to(torch.bfloat16)
    a = F.rms_norm(taps, (576,), eps=1e-5)
    b = add_rms_norm(taps.reshape(-1, 576), None, one, 1e-5).view_as(taps)
    print(R, "F.rms_norm %.3f C %.3f" % (t(lambda: F.rms_norm(taps, (576,), eps=1e-5)), t(lambda: add_rms_norm(taps.reshape(-1, 576), None, one, 1e-5))),
          "equal", torch.equal(a, b), "frac diff", (a != b).float().mean().item())
