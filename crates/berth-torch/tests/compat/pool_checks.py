"""The torch.cuda.MemPool checks of the compatibility suite (registered by checks.py, in the
table's order): a private pool used through use_mem_pool, a use_on_oom pool lending its cache,
and a pool with an allocator of its own (`Note [Pools with their own allocator]` in
berth-alloc). torch is imported inside each check: checks.py imports this file for `--list`
too, where torch may be missing."""
import ctypes
import os
import subprocess
import tempfile

from harness import MiB, Refused, Skip, check, cuda, driver_used_bytes, expect, step

@check
def check_mempool_use_on_oom(alloc):
    """torch.cuda.MemPool(use_on_oom=True): with the memory fraction leaving no room for new
    memory, a request outside the pool is served from the pool's cached free memory instead of
    raising torch.OutOfMemoryError."""
    import inspect

    import torch
    if not hasattr(torch.cuda, "MemPool") or "use_on_oom" not in inspect.signature(
            torch.cuda.MemPool.__init__).parameters:
        raise Skip("this PyTorch's MemPool has no use_on_oom")
    mib = 1 << 20
    step("MemPool(use_on_oom=True), 64 MiB used in it and freed")
    pool = torch.cuda.MemPool(use_on_oom=True)
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(64 * mib, dtype=torch.uint8, device=cuda())
    del t
    torch.cuda.synchronize()
    total = torch.cuda.get_device_properties(0).total_memory
    reserved = torch.cuda.memory_reserved()
    ooms = torch.cuda.memory_stats().get("num_ooms", 0)
    step("memory fraction leaving 4 MiB, then a 32 MiB request outside the pool")
    torch.cuda.set_per_process_memory_fraction((reserved + 4 * mib) / total)
    try:
        x = torch.empty(32 * mib, dtype=torch.uint8, device=cuda())
        x.fill_(7)
        torch.cuda.synchronize()
        grown = torch.cuda.memory_reserved() - reserved
        expect(grown == 0, f"reserved memory grew by {grown} bytes: the pool did not lend")
        expect(torch.cuda.memory_stats().get("num_ooms", 0) == ooms,
               "an out-of-memory was counted though the pool served the request")
        del x
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    return "a 32 MiB request past the memory fraction was served from the pool's cached memory"


@check
def check_mempool(alloc):
    import torch
    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        raise Skip(f"torch {torch.__version__} has no torch.cuda.MemPool / use_mem_pool")
    dev = cuda()
    torch.ones(1, device=dev)  # start CUDA (the context's own memory) before the baseline
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    used0 = driver_used_bytes()
    step("MemPool()")
    pool = torch.cuda.MemPool()
    sizes = (1 * MiB, 4 * MiB, 96 * MiB)
    step("allocate in the pool")
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.full((n,), k + 1, dtype=torch.uint8, device=dev) for k, n in enumerate(sizes)]
    ranges = [(t.data_ptr(), t.data_ptr() + t.numel()) for t in ts]
    count = None
    if hasattr(pool, "use_count"):
        step("pool.use_count()")
        count = pool.use_count()
        expect(count >= 1, f"pool.use_count() is {count} while the pool is alive")
    seg_note = "no pool snapshot in this torch"
    if hasattr(pool, "snapshot"):
        step("pool.snapshot()")
        segs = pool.snapshot()
        expect(len(segs) > 0, "pool.snapshot() lists no segments while tensors live in it")
        for s in segs:
            expect(tuple(s.get("segment_pool_id", ())) == tuple(pool.id),
                   f"pool.snapshot() lists a segment of pool {s.get('segment_pool_id')}, "
                   f"not {tuple(pool.id)}")
        for lo, hi in ranges:
            expect(any(s["address"] <= lo and hi <= s["address"] + s["total_size"] for s in segs),
                   "a tensor allocated in the pool is not inside the pool's segments")
        seg_note = f"{len(segs)} pool segments"
    # The pool is private: while it lives, its freed blocks must not serve allocations made
    # outside it (CUDA graphs depend on this).
    step("allocate outside the pool")
    del ts
    outside = [torch.full((n,), 9, dtype=torch.uint8, device=dev) for n in sizes]
    for t in outside:
        lo, hi = t.data_ptr(), t.data_ptr() + t.numel()
        expect(not any(lo < b and a < hi for a, b in ranges),
               "an allocation outside the pool reused a block of the live pool")
    step("allocate in the pool again")
    with torch.cuda.use_mem_pool(pool):
        again = torch.full((sizes[-1],), 5, dtype=torch.uint8, device=dev)
    expect(int(again.sum()) == 5 * sizes[-1], "a pool tensor does not hold its values")
    for t in outside:
        expect(bool((t == 9).all()), "a tensor outside the pool was overwritten")
    step("release the pool")
    del again, outside, pool, t  # t: the loop variable still holds the last outside tensor
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    used = driver_used_bytes() - used0
    expect(used < 32 * MiB,
           f"{used / MiB:.0f} MiB still used at the driver after the pool was deleted and "
           "empty_cache ran (the pool held 101 MiB)")
    return f"use_count {count}, {seg_note}, pool private, released ({used / MiB:+.0f} MiB)"


# A CUDAPluggableAllocator that counts what it hands out (PyTorch's pluggable C hooks). It
# calls the driver (cuMemAlloc on the context PyTorch made current), declared here, so that
# building it needs gcc only: no CUDA headers, and no CUDA runtime that could differ from
# PyTorch's.
OWN_ALLOCATOR_C = r"""
#include <stddef.h>
#include <sys/types.h>
typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
int cuMemFree_v2(CUdeviceptr ptr);
static long long n_alloc, n_free, live;
void *own_malloc(ssize_t size, int device, void *stream) {
  CUdeviceptr p = 0;
  (void)device; (void)stream;
  if (cuMemAlloc_v2(&p, (size_t)size) != 0) return 0;
  __atomic_add_fetch(&n_alloc, 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&live, (long long)size, __ATOMIC_SEQ_CST);
  return (void *)p;
}
void own_free(void *p, ssize_t size, int device, void *stream) {
  (void)device; (void)stream;
  cuMemFree_v2((CUdeviceptr)p);
  __atomic_add_fetch(&n_free, 1, __ATOMIC_SEQ_CST);
  __atomic_sub_fetch(&live, (long long)size, __ATOMIC_SEQ_CST);
}
long long own_allocs(void) { return __atomic_load_n(&n_alloc, __ATOMIC_SEQ_CST); }
long long own_frees(void) { return __atomic_load_n(&n_free, __ATOMIC_SEQ_CST); }
long long own_live(void) { return __atomic_load_n(&live, __ATOMIC_SEQ_CST); }
"""


def _build_own_allocator():
    """Compiles OWN_ALLOCATOR_C with gcc against the driver (libcuda.so.1); the .so's path. A
    machine without gcc skips the check, under every allocator alike."""
    folder = tempfile.mkdtemp(prefix="berth-own-alloc-")
    src, so = os.path.join(folder, "own_alloc.c"), os.path.join(folder, "own_alloc.so")
    with open(src, "w") as f:
        f.write(OWN_ALLOCATOR_C)
    cmd = ["gcc", "-O2", "-shared", "-fPIC", src, "-o", so, "-l:libcuda.so.1"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Skip(f"cannot build the test's pluggable allocator: {e}")
    if r.returncode != 0:
        raise Skip("cannot build the test's pluggable allocator (gcc and the driver's "
                   f"libcuda.so.1 are needed): {r.stderr.strip().splitlines()[-1:]}")
    return so


@check
def check_mempool_own_allocator(alloc):
    """torch.cuda.MemPool(allocator=CUDAPluggableAllocator(...)), as vLLM's sleep mode and
    NCCL's registered memory use it: the pool's segments come from that allocator and go back
    to it once the pool is gone, tensors in the pool hold their values, and the memory counts
    in torch.cuda.memory_reserved(). berth's expandable and paged refuse such a pool, saying
    why and what to do instead (PyTorch's expandable segments refuse it too)."""
    import torch
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda.memory,
                                                         "CUDAPluggableAllocator"):
        raise Skip(f"torch {torch.__version__} has no MemPool / CUDAPluggableAllocator")
    step("build a counting pluggable allocator")
    so = _build_own_allocator()
    lib = ctypes.CDLL(so)
    for name in ("own_allocs", "own_frees", "own_live"):
        getattr(lib, name).restype = ctypes.c_longlong
    own = torch.cuda.memory.CUDAPluggableAllocator(so, "own_malloc", "own_free")
    dev = cuda()
    torch.ones(1, device=dev)
    step("MemPool(allocator=...)")
    try:
        pool = torch.cuda.MemPool(allocator=own.allocator())
    except RuntimeError as e:
        said = str(e).strip().splitlines()[0]
        if alloc not in ("berth:expandable", "berth:paged"):
            raise
        expect("MemPool(allocator=...)" in said and "policy" in said,
               f"refused without saying why and what to do instead: {said}")
        step("allocate after the refusal")
        t = torch.full((MiB,), 2, dtype=torch.uint8, device=dev)
        expect(int(t.sum()) == 2 * MiB, "allocation after the refusal is wrong")
        expect(lib.own_allocs() == 0, "the refused pool's allocator was called")
        raise Refused(said.removeprefix("berth: "))
    step("allocate in the pool")
    reserved0 = torch.cuda.memory_reserved()
    with torch.cuda.use_mem_pool(pool):
        large = torch.full((3 * MiB,), 3, dtype=torch.uint8, device=dev)
        small = torch.full((1000,), 4, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    n, live = lib.own_allocs(), lib.own_live()
    expect(n >= 2, f"the pool's allocator gave {n} segments for a large and a small tensor")
    expect(live >= 3 * MiB + 1000, f"the pool's allocator holds {live} bytes")
    grown = torch.cuda.memory_reserved() - reserved0
    expect(grown == live, f"memory_reserved() grew by {grown} bytes, the pool's allocator "
           f"holds {live}")
    expect(int(large.sum()) == 9 * MiB and int(small.sum()) == 4000,
           "a tensor in the pool does not hold its values")
    if hasattr(pool, "snapshot"):
        segs = pool.snapshot()
        expect(sum(s["total_size"] for s in segs) == live,
               f"the pool's snapshot holds {sum(s['total_size'] for s in segs)} bytes, its "
               f"allocator {live}")
    step("allocate outside the pool")
    outside = torch.full((3 * MiB,), 5, dtype=torch.uint8, device=dev)
    expect(lib.own_allocs() == n, "an allocation outside the pool used the pool's allocator")
    step("release the pool")
    del large, small, pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    expect(lib.own_frees() == n and lib.own_live() == 0,
           f"{lib.own_frees()} of {n} segments given back to the pool's allocator, "
           f"{lib.own_live()} bytes still held")
    expect(int(outside.sum()) == 15 * MiB, "a tensor outside the pool was overwritten")
    return (f"{n} segments ({live / MiB:.0f} MiB) from the pool's allocator, counted in "
            f"memory_reserved, all given back after the pool went")
