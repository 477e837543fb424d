"""A stand-in for berth_torch that installs trivial_alloc.so (a trivial caching allocator in C)
behind the same CUDAPluggableAllocator ABI, so torch_live.py --allocator berth:trivial measures
what PyTorch's pluggable-allocator wrapper costs alone. Put this directory first on PYTHONPATH
and set TRIVIAL_ALLOC_SO to the compiled library."""
import ctypes, os
import torch

_so = os.environ["TRIVIAL_ALLOC_SO"]
_lib = ctypes.CDLL(_so)
_lib.trivial_stat.restype = ctypes.c_longlong
_alloc = None


def use_allocator(policy):
    global _alloc
    assert policy == "trivial", policy
    _alloc = torch.cuda.memory.CUDAPluggableAllocator(_so, "trivial_alloc", "trivial_free")
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
    _alloc._allocator.set_record_stream_fn(addr(_lib.trivial_record_stream))
    _alloc._allocator.set_reset_fn(addr(_lib.trivial_reset))
    torch.cuda.memory.change_current_allocator(_alloc)


def memory_stats(device=None):
    s = [_lib.trivial_stat(i) for i in range(5)]
    return {"reserved_bytes.all.peak": s[0], "allocated_bytes.all.peak": s[1],
            "num_device_alloc": s[2], "reserved_bytes.all.current": s[3],
            "allocated_bytes.all.current": s[4]}
