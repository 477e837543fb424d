"""Sleep and wake of tagged GPU memory under berth's ``paged`` policy (berth_torch.region,
sleep, wake, sleeping_bytes, sleep_stats, keep_host_memory).

Serving and reinforcement-learning stacks hand GPU memory between phases: vLLM's sleep mode
(https://github.com/vllm-project/vllm/blob/main/vllm/device_allocator/cumem.py) and sglang's
``torch_memory_saver`` tag allocations, release their physical pages and keep their virtual
addresses. berth does the same inside its own allocator, so one allocator gives both lower
fragmentation and sleep mode:

    berth_torch.use_allocator("paged")
    with berth_torch.region("weights"):
        model = build_model().cuda()
    with berth_torch.region("kv_cache"):
        cache = torch.empty(..., device="cuda")
    berth_torch.sleep(["weights", "kv_cache"], offload=["weights"])   # pages back to the driver
    ...                                                              # another phase uses them
    berth_torch.wake(["weights", "kv_cache"])                         # same addresses again

The rules:

- A tag is per thread: allocations made by the thread inside ``region(tag)`` carry it.
  PyTorch runs ``backward()`` on threads of its own, so gradients it makes there are untagged
  (allocate them inside the region first, for example with ``zero_grad(set_to_none=False)``).
- Cached free memory is reused only within its tag, so a tag's pages can be released without
  touching another's.
- ``sleep`` synchronises the device, copies the live tensors of the ``offload`` tags to pinned
  host memory, then releases every page of every tag in ``tags``. Tensors, raw pointers and CUDA
  graphs keep their addresses; the contents of tags slept without offload are lost (a KV cache
  is usually refilled, weights usually offloaded).
- ``wake`` maps new pages at the same addresses and copies the backups back. A wake that cannot
  get device memory raises and leaves every tag asleep with its backups.
- Allocating in a sleeping tag raises, naming the tag; so does sleeping a tag twice or waking
  one that is awake. A tag must have allocated before it can sleep.
- Memory registered with NCCL at a sleeping address must be registered again after the wake.
- Only ``paged`` can sleep; under ``pytorch`` or ``expandable`` these functions raise.
"""
import contextlib

# The package imports this module last, after defining `_device`.
from . import _device, _native


def _tags(tags, what):
    if isinstance(tags, str):
        return [tags]
    out = list(tags)
    if not all(isinstance(t, str) for t in out):
        raise TypeError(f"{what}: expected a tag name or a list of tag names, got {tags!r}")
    return out


@contextlib.contextmanager
def region(tag):
    """Allocations this thread makes inside the block carry ``tag`` (``torch_memory_saver``'s
    ``region``, vLLM's ``use_memory_pool(tag)``). Regions nest; leaving one restores the
    enclosing tag. ``ValueError`` for an empty tag."""
    _native.push_tag(tag)
    try:
        yield
    finally:
        _native.pop_tag()


def current_tag():
    """The tag this thread's allocations carry now, or None."""
    return _native.current_tag()


def sleep(tags, offload=(), device=None):
    """Puts ``tags`` (a name or a list) to sleep on ``device``: the live tensors of the tags in
    ``offload`` are copied to pinned host memory (one buffer per tag), then every page of every
    tag is given back to the driver, each page as soon as its copies are done. Returns
    ``{"released_bytes", "offloaded_bytes", "synchronize_s", "host_memory_s",
    "copy_and_release_s"}``: the bytes, and where the time went (waiting for queued work,
    page-locking host memory, the copies with the release).

    Raises ``ValueError`` for an unknown tag or an ``offload`` tag not in ``tags``,
    ``RuntimeError`` for a tag already asleep, no pinned host memory (nothing was released), a
    policy other than ``paged``, or a CUDA graph being captured."""
    released, offloaded, sync_s, host_s, copy_s = _native.sleep(
        _device(device), _tags(tags, "sleep"), _tags(offload, "sleep(offload=...)"))
    return {"released_bytes": released, "offloaded_bytes": offloaded,
            "synchronize_s": sync_s, "host_memory_s": host_s, "copy_and_release_s": copy_s}


def wake(tags, device=None):
    """Wakes ``tags`` on ``device``: device memory at the same addresses again, the offloaded
    contents copied back (each tensor's copy starts as soon as its pages are mapped). Returns
    ``{"mapped_bytes", "restored_bytes", "map_and_copy_s", "free_host_memory_s"}``. Unless
    ``keep_host_memory(True)``, the pinned backups are freed by a background thread after the
    copies (``free_host_memory_s`` is the hand-over); ``kept_host_bytes()`` and
    ``release_host_memory()`` wait for those frees.

    Raises ``ValueError`` for an unknown tag, ``RuntimeError`` for a tag that is awake or when
    the device memory cannot be had (every tag stays asleep, backups kept)."""
    mapped, restored, map_s, free_s = _native.wake(_device(device), _tags(tags, "wake"))
    return {"mapped_bytes": mapped, "restored_bytes": restored,
            "map_and_copy_s": map_s, "free_host_memory_s": free_s}


def keep_host_memory(keep=True):
    """Whether the pinned host memory of backups freed at ``wake`` is kept for the next
    ``sleep`` (default: not kept, it goes back to the system at wake). Page-locking host memory
    costs more than the copy itself, so a loop that sleeps and wakes every iteration runs every
    sleep after the first faster with ``keep_host_memory(True)``, holding that host memory
    while awake: ``kept_host_bytes()`` says how much, ``release_host_memory()`` frees it."""
    _native.keep_host_memory(bool(keep))


def kept_host_bytes():
    """Pinned host bytes kept by ``keep_host_memory(True)`` for the next sleep, once the
    background frees of earlier wakes are done."""
    return _native.kept_host_bytes()


def release_host_memory():
    """Frees the pinned host memory kept by ``keep_host_memory(True)``; returns the bytes freed.
    The backups of tags still asleep are not touched."""
    return _native.release_host_memory()


def sleep_stats(device=None):
    """``{"sleeping_bytes", "sleeping_allocated_bytes", "offloaded_bytes", "sleeping_tags"}``
    of ``device``: device bytes given back by sleeping tags, the live bytes of their tensors,
    the pinned host bytes holding backups, and the sleeping tags (sorted)."""
    released, allocated, offloaded, tags = _native.sleep_stats(_device(device))
    return {"sleeping_bytes": released, "sleeping_allocated_bytes": allocated,
            "offloaded_bytes": offloaded, "sleeping_tags": list(tags)}


def sleeping_bytes(device=None):
    """Device bytes given back to the driver by sleeping tags of ``device``."""
    return sleep_stats(device)["sleeping_bytes"]
