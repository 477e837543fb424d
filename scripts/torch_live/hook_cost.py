"""Per-call cost of the allocator under live PyTorch, one allocator per process.

usage: python3 hook_cost.py ALLOCATOR SO [--count-resnet50]
  ALLOCATOR  default | berth:<policy> | berth:trivial (trivial_alloc.c via trivial_shim)
  SO         hook_cost.so, built from hook_cost.cpp against this torch (torch-live.sh builds it)
Prints one JSON line: ns per (raw_delete + raw_alloc) pair through c10's allocator object, the
median of 7 repeats of 200,000 pairs after a warm-up, with 32 blocks live; with
--count-resnet50 (default or berth:<policy>), also the allocations per resnet50_train step (torch_live.py's step), read
from memory_stats()'s allocation.all.allocated over 3 steps after 2 warm-up steps.
"""
import ctypes, json, statistics, sys

alloc = sys.argv[1]
import torch  # noqa: E402

mod = None
if alloc.startswith("berth:"):
    import berth_torch as mod  # noqa: E402  (trivial_shim is also importable as berth_torch)
    mod.use_allocator(alloc.split(":", 1)[1])
torch.zeros(1, device="cuda")
lib = ctypes.CDLL(sys.argv[2])
f = lib.berth_hook_cost_ns
f.restype = ctypes.c_double
f.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64]
f(200_000, 32, 1)  # warm-up: fills the cache with every size class the loop uses
reps = [f(200_000, 32, 1) for _ in range(7)]
out = dict(allocator=alloc, ns_per_pair=statistics.median(reps), reps=reps)
if "--count-resnet50" in sys.argv:
    import torchvision
    stats = torch.cuda.memory_stats if mod is None else mod.memory_stats
    m = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(1)
    def step():
        x = torch.randn(64, 3, 224, 224, device="cuda", generator=g)
        y = torch.randint(0, 1000, (64,), device="cuda", generator=g)
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        return float(loss)
    for _ in range(2):
        step()
    a0 = stats()["allocation.all.allocated"]
    for _ in range(3):
        step()
    out["resnet50_allocs_per_step"] = (stats()["allocation.all.allocated"] - a0) / 3
print(json.dumps(out))
