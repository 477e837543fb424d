"""Loads berth-torch's shared library with ctypes, as PyTorch's CUDAPluggableAllocator does
(dlopen + the hook symbols by name), and calls the hooks over a simulated device.
usage: python3 ctypes_smoke.py PATH_TO_LIBBERTH_TORCH_SO"""
import ctypes, sys

lib = ctypes.CDLL(sys.argv[1])
vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
for name, res, args in [
    ("berth_torch_alloc", vp, [sz, ci, vp]), ("berth_torch_free", None, [vp, sz, ci, vp]),
    ("berth_torch_record_stream", None, [vp, vp]), ("berth_torch_reset", None, []),
    ("berth_torch_set_memory_fraction", None, [ctypes.c_double, ci]),
    ("berth_torch_init", None, [ci]), ("berth_torch_install", ci, [ctypes.c_char_p] * 2),
    ("berth_torch_simulate", ci, [ctypes.c_uint64]),
    ("berth_torch_stat", ctypes.c_int64, [ci, ctypes.c_char_p]),
    ("berth_torch_last_error", sz, [ctypes.c_char_p, sz]),
]:
    f = getattr(lib, name); f.restype = res; f.argtypes = args

def last_error():
    buf = ctypes.create_string_buffer(2048)
    lib.berth_torch_last_error(buf, len(buf))
    return buf.value.decode()

assert lib.berth_torch_install(b"nonsense", None) == -1
assert "paged" in last_error() and "pytorch" in last_error(), last_error()
assert lib.berth_torch_simulate(1 << 30) == 0
assert lib.berth_torch_install(b"paged", b"") == 0, last_error()
lib.berth_torch_init(1)
p = lib.berth_torch_alloc(1 << 20, 0, None)
assert p, last_error()
assert lib.berth_torch_stat(0, b"allocated_bytes.all.current") == 1 << 20
lib.berth_torch_record_stream(p, ctypes.c_void_p(0x20))
lib.berth_torch_free(p, 1 << 20, 0, None)
assert lib.berth_torch_stat(0, b"allocated_bytes.all.current") == 0
lib.berth_torch_reset()
lib.berth_torch_set_memory_fraction(0.5, 0)
assert not lib.berth_torch_alloc(1 << 40, 0, None)
assert "out of memory" in last_error(), last_error()
print("ctypes smoke: ok")
