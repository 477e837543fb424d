"""berth_torch.region / sleep / wake / sleeping_bytes over a simulated device, through the
installed package (no GPU, no torch needed): the allocation hook is called with ctypes, as
PyTorch's allocator calls it.
usage: python3 sleep_smoke.py        (berth_torch importable; prints "sleep smoke: ok")"""
import ctypes

import berth_torch
from berth_torch import _native

MiB = 1 << 20
_native.simulate(8 << 30)
_native.install("paged", "")
lib = ctypes.CDLL(_native.__file__)
lib.berth_torch_alloc.restype = ctypes.c_void_p
lib.berth_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.berth_torch_last_error.restype = ctypes.c_size_t
lib.berth_torch_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def alloc(n):
    return lib.berth_torch_alloc(n, 0, None)


def last_error():
    buf = ctypes.create_string_buffer(2048)
    lib.berth_torch_last_error(buf, len(buf))
    return buf.value.decode()


def raises(exc, f, *args, **kw):
    try:
        f(*args, **kw)
    except exc as e:
        return str(e)
    raise AssertionError(f"{f.__name__}{args} did not raise {exc.__name__}")


assert berth_torch.current_tag() is None
with berth_torch.region("weights"):
    assert berth_torch.current_tag() == "weights"
    w = alloc(64 * MiB)
    with berth_torch.region("kv_cache"):
        k = alloc(256 * MiB)
    assert berth_torch.current_tag() == "weights", "leaving a region restores the enclosing tag"
assert berth_torch.current_tag() is None
assert w and k, last_error()
reserved = berth_torch.memory_reserved(0)

r = berth_torch.sleep(["weights", "kv_cache"], offload="weights")
assert r["released_bytes"] >= 320 * MiB and r["offloaded_bytes"] == 64 * MiB, r
assert all(r[k] >= 0.0 for k in ("synchronize_s", "host_memory_s", "copy_and_release_s")), r
assert berth_torch.memory_reserved(0) == reserved - r["released_bytes"]
st = berth_torch.sleep_stats()
assert st["sleeping_tags"] == ["kv_cache", "weights"] and st["offloaded_bytes"] == 64 * MiB, st
assert berth_torch.sleeping_bytes() == r["released_bytes"]

with berth_torch.region("kv_cache"):
    assert not alloc(MiB), "an allocation in a sleeping tag is refused"
assert "kv_cache" in last_error(), last_error()
assert "asleep" in raises(RuntimeError, berth_torch.sleep, "weights").lower()
raises(ValueError, berth_torch.sleep, "no_such_tag")
raises(ValueError, berth_torch.region("").__enter__)
raises(TypeError, berth_torch.sleep, [1])

m = berth_torch.wake(["weights", "kv_cache"])
assert m["mapped_bytes"] == r["released_bytes"], m
assert m["restored_bytes"] == 64 * MiB and m["map_and_copy_s"] >= 0.0, m
# Simulated backups are not pinned memory: nothing is kept.
berth_torch.keep_host_memory(True)
assert berth_torch.kept_host_bytes() == 0 and berth_torch.release_host_memory() == 0
berth_torch.keep_host_memory(False)
assert berth_torch.sleeping_bytes() == 0 and berth_torch.memory_reserved(0) == reserved
raises(RuntimeError, berth_torch.wake, "weights")
print("sleep smoke: ok")
