"""PyTorch's 4 GiB device-to-device copy (bytes read + written per second), on a chosen
allocator: the same figure as `berth bench transfers`' d2d, from PyTorch, in the same call.
usage: d2d.py default|expandable|berth:<policy>   (prints one JSON line)"""
import json, os, sys

alloc = sys.argv[1]
if alloc == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import torch  # noqa: E402

if alloc.startswith("berth:"):
    import berth_torch
    berth_torch.use_allocator(alloc.split(":", 1)[1])
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
ms = []
for _ in range(11):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); e.synchronize()
    ms.append(s.elapsed_time(e))
ms.sort()
print(json.dumps({"allocator": alloc, "d2d_GBps_read+write": 2 * n / (ms[5] * 1e-3) / 1e9,
                  "median_ms": ms[5]}), flush=True)
