"""berth's CUDA allocators under PyTorch.

    import torch, berth_torch
    berth_torch.use_allocator("paged")      # before any CUDA allocation
    # ... an ordinary PyTorch program ...
    torch.cuda.memory_stats()               # PyTorch's own functions answer from berth
    berth_torch.memory_summary()            # PyTorch's table, then the driver's side
    torch.cuda.empty_cache()                # returns berth's free cached memory
    berth_torch.dump_snapshot("s.pickle")   # torch.cuda.memory._dump_snapshot's format

Policies: "pytorch" (PyTorch's caching allocator, byte for byte), "expandable" (with
expandable segments) and "paged" (berth's own: lower peak reserved).

The allocator PyTorch gets is berth's full ``CUDAAllocator`` (``csrc/allocator.cpp``), compiled
at first use against the installed PyTorch with ``torch.utils.cpp_extension`` and cached: with
it, PyTorch's own ``torch.cuda.memory_stats()``, ``memory_summary()``, ``memory._snapshot()``,
``memory._record_memory_history()``, ``torch.cuda.MemPool``, CUDA graphs and
``torch.compile(mode="reduce-overhead")`` answer from berth. Where no C++ compiler or CUDA
headers are found it falls back, with one warning, to PyTorch's ``CUDAPluggableAllocator``,
under which those functions raise "does not yet support"; this module's functions answer with
the same names and meanings either way. A request berth cannot serve (after freeing its cached
blocks and retrying) raises ``torch.OutOfMemoryError`` with berth's message.

Setting ``BERTH_TORCH_ALLOCATOR=paged`` (or another policy) in the environment installs the
policy at ``import berth_torch``, so a program needs only the import;
``BERTH_TORCH_PLUGGABLE=1`` skips the full allocator and installs the ``CUDAPluggableAllocator``.
"""

import os
import pickle
import sys
import warnings

from . import _native

_native.warnings_said()  # from here on berth's warnings reach the user through `warnings`

__all__ = [
    "POLICY_NAMES", "use_allocator", "installed_policy", "memory_stats", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "memory_summary", "empty_cache", "record_memory_history",
    "snapshot", "dump_snapshot", "set_per_process_memory_fraction", "check_errors",
    "full_allocator", "region", "current_tag", "sleep", "wake", "sleep_stats", "sleeping_bytes",
    "keep_host_memory", "kept_host_bytes", "release_host_memory",
]

POLICY_NAMES = tuple(_native.POLICY_NAMES)
_ALLOCATOR = None  # the installed allocator (the C++ module, or a CUDAPluggableAllocator)
_FULL = None  # whether the installed allocator is the full one
_WARNED = set()  # keys of berth's warnings already shown with warnings.warn


def _show_warnings():
    """Shows each warning berth said (a setting PyTorch accepts but ignores, ...) once, with
    Python's ``warnings.warn``."""
    for key, message in _native.warnings_said():
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"berth: {message}", RuntimeWarning, stacklevel=3)


def _build_full_allocator():
    """The C++ allocator module, built at first use against this PyTorch and cached by
    ``torch.utils.cpp_extension`` (a rebuild only when the source or PyTorch changes); None,
    with one warning saying what is lost, when it cannot be built."""
    import torch
    from torch.utils import cpp_extension

    src = os.path.join(os.path.dirname(__file__), "csrc", "allocator.cpp")
    tag = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    try:
        return cpp_extension.load(
            name=f"berth_torch_allocator_{tag}", sources=[src], with_cuda=True,
            extra_cflags=["-O2"], verbose=os.environ.get("BERTH_TORCH_VERBOSE_BUILD") == "1")
    except Exception as e:  # no compiler, no CUDA headers, a PyTorch without its headers
        warnings.warn(
            "berth_torch: the full allocator could not be built against this PyTorch "
            f"({type(e).__name__}: {str(e).strip()[-400:]}); using PyTorch's "
            "CUDAPluggableAllocator instead, under which torch.cuda.memory_stats(), "
            "torch.cuda.memory._snapshot(), torch.cuda.MemPool and "
            "torch.compile(mode='reduce-overhead') raise. berth_torch's own functions still "
            "answer. Install g++, ninja (pip install ninja) and the CUDA toolkit headers "
            "(CUDA_HOME) to get them.",
            RuntimeWarning, stacklevel=3)
        return None


def use_allocator(policy="paged", options=""):
    """Makes berth's ``policy`` PyTorch's CUDA allocator for the rest of the process.

    ``options`` are PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` options for the policy
    (``"max_split_size_mb:512"``; not ``backend`` or ``expandable_segments``, which the policy
    name sets). Must run before CUDA starts: right after ``import torch``, before any tensor is
    put on the GPU. Calling it again with the same policy does nothing.

    Raises ``ValueError`` for an unknown policy (naming the valid ones) or bad options, and
    ``RuntimeError`` when CUDA already started or another allocator is installed.
    """
    global _ALLOCATOR, _FULL
    if not isinstance(policy, str) or policy not in POLICY_NAMES:
        raise ValueError(
            f"unknown berth allocator policy {policy!r}: use one of "
            + ", ".join(repr(p) for p in POLICY_NAMES))
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "berth_torch.use_allocator() puts berth's allocator under PyTorch, and PyTorch is "
            f"not importable here ({e}); install it first (pip install torch)") from e
    if _ALLOCATOR is not None:
        _native.install(policy, options)  # same policy: a no-op; another: RuntimeError
        return
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "berth_torch.use_allocator() must run before CUDA starts, and CUDA has already "
            "started in this process (a tensor was put on the GPU, or a torch.cuda call "
            "initialised it). Call berth_torch.use_allocator(...) right after `import torch`, "
            "before any CUDA work, or start a new process.")
    full = _build_full_allocator() if os.environ.get("BERTH_TORCH_PLUGGABLE") != "1" else None
    if full is not None and not full.can_install():
        # Checked before berth installs anything, so a refused swap leaves no policy behind.
        raise RuntimeError(
            "berth_torch.use_allocator(): PyTorch's CUDA allocator is already in use in this "
            "process, so PyTorch will not swap it. torch.cuda.current_device(), "
            "torch.cuda.get_device_capability(), pin_memory() and any CUDA tensor start it, even "
            "while torch.cuda.is_initialized() is still False. Call use_allocator right after "
            "`import torch` (or set BERTH_TORCH_ALLOCATOR and import berth_torch first).")
    _native.install(policy, options)
    _show_warnings()
    _native.set_oom_exception(torch.OutOfMemoryError)
    try:
        if full is not None:
            full.install(_native.__file__, policy)
            _ALLOCATOR, _FULL = full, True
            return
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            _native.__file__, "berth_torch_alloc", "berth_torch_free")
        for setter, address in _native.hook_addresses().items():
            getattr(alloc._allocator, setter)(address)
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError(
            "berth_torch.use_allocator(): PyTorch refused to switch allocators ("
            f"{e}). This happens when CUDA already allocated memory in this process; call "
            "use_allocator right after `import torch`.") from e
    _ALLOCATOR, _FULL = alloc, False


def full_allocator():
    """Whether the installed allocator is berth's full one (PyTorch's own memory functions,
    MemPool and CUDA graphs answer from berth), False for the CUDAPluggableAllocator
    fallback, None before :func:`use_allocator`."""
    return _FULL


def installed_policy():
    """The name of the policy PyTorch allocates from, or None when berth is not PyTorch's
    allocator (before :func:`use_allocator`, or after PyTorch refused the swap)."""
    return _native.installed_policy() if _ALLOCATOR is not None else None


def _device(device):
    """A device index from PyTorch's ``device=None | int | str | torch.device``."""
    if device is None:
        try:
            import torch
        except ImportError:  # no torch: only the simulated devices of the tests
            return 0
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device index {device} is negative; use 0 or more, or None")
        return device
    import torch
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {d}")
    return _device(d.index)


def memory_stats(device=None):
    """``torch.cuda.memory_stats(device)``: PyTorch's key names and meanings, sorted; empty
    before the device's first allocation."""
    return dict(_native.memory_stats(_device(device)))


def memory_allocated(device=None):
    """Bytes held by live tensors (``torch.cuda.memory_allocated``)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    """Peak of :func:`memory_allocated` (``torch.cuda.max_memory_allocated``)."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    """Bytes reserved from the driver (``torch.cuda.memory_reserved``)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    """Peak of :func:`memory_reserved` (``torch.cuda.max_memory_reserved``)."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    """Sets every peak to its current value (``torch.cuda.reset_peak_memory_stats``)."""
    _native.reset_peak_memory_stats(_device(device))


def reset_accumulated_memory_stats(device=None):
    """Zeroes the accumulated counters (``torch.cuda.reset_accumulated_memory_stats``)."""
    _native.reset_accumulated_memory_stats(_device(device))


def memory_summary(device=None, abbreviated=False):
    """PyTorch's table (``torch.cuda.memory_summary``), with a line naming berth's policy and,
    at the end, the driver's used bytes (``cuMemGetInfo``), berth's share of them and the waste
    (peak reserved over peak allocated)."""
    return _native.memory_summary(_device(device), bool(abbreviated))


def empty_cache():
    """Returns free cached memory to the driver (what ``torch.cuda.empty_cache()`` does through
    the reset hook), raising if it failed."""
    _native.empty_cache()


def set_per_process_memory_fraction(fraction, device=None):
    """Caps reserved memory at ``fraction`` of the device's memory, raising ``ValueError``
    unless 0 <= fraction <= 1 (``torch.cuda.set_per_process_memory_fraction``)."""
    _native.set_memory_fraction(float(fraction), _device(device))


def record_memory_history(enabled="all", context=None, stacks=None, max_entries=sys.maxsize,
                          device=None):
    """``torch.cuda.memory._record_memory_history``: starts recording allocation events (up to
    ``max_entries``, newest kept) or stops and clears with ``enabled=None``. berth records no
    Python stacks; ``context`` and ``stacks`` are accepted and ignored."""
    if enabled not in (None, "all", "state"):
        raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
    _native.record_memory_history(_device(device), None if enabled is None else int(max_entries))


def snapshot():
    """``torch.cuda.memory._snapshot()``: segments, blocks and the recorded history."""
    return pickle.loads(_native.snapshot_pickle())


def dump_snapshot(filename="dump_snapshot.pickle"):
    """``torch.cuda.memory._dump_snapshot``: writes the pickle that
    ``python -m torch.cuda._memory_viz`` and https://pytorch.org/memory_viz open."""
    with open(filename, "wb") as f:
        f.write(_native.snapshot_pickle())


def check_errors():
    """Raises ``RuntimeError`` with the first error a hook that returns nothing to PyTorch
    (free, record_stream, empty_cache, memory fraction) could not report, and clears it."""
    msg = _native.take_deferred_error()
    if msg is not None:
        raise RuntimeError(msg)


# Sleep and wake of tagged memory (paged): berth_torch.region, sleep, wake, sleeping_bytes.
from ._sleep_mode import (  # noqa: E402
    current_tag, keep_host_memory, kept_host_bytes, region, release_host_memory, sleep,
    sleep_stats, sleeping_bytes, wake,
)

# BERTH_TORCH_ALLOCATOR=<policy>: install at import, so a program needs only the import.
if os.environ.get("BERTH_TORCH_ALLOCATOR"):
    use_allocator(os.environ["BERTH_TORCH_ALLOCATOR"],
                  os.environ.get("BERTH_TORCH_ALLOCATOR_OPTIONS", ""))
