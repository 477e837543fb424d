"""pytest wrapper for berth_torch's compatibility suite: one test per (check, allocator), each
running `checks.py` in a fresh process (an allocator is chosen once per process, before CUDA).

usage: python3 -m pytest crates/berth-torch/tests/compat -q
Env:   BERTH_TORCH_ALLOCATORS (comma or space separated; default all four),
       BERTH_COMPAT_TIMEOUT (seconds per process; default 120).

Without torch or a CUDA device every test is skipped: the suite runs on the GPU machine
(scripts/torch-compat.sh, which also prints the side-by-side table). A berth allocator whose
package is not importable is skipped with the import error. train_losses under a berth
allocator also runs default's and requires equal losses.
"""
import functools
import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_compat  # noqa: E402 - a sibling file, found through the line above

NO_DEVICE = ("no CUDA device: the compatibility suite runs on the GPU machine "
             "(scripts/torch-compat.sh)")
TIMEOUT_S = float(os.environ.get("BERTH_COMPAT_TIMEOUT", run_compat.DEFAULT_TIMEOUT_S))
CHECKS = run_compat.list_checks()
ALLOCATORS = run_compat.allocators_from()


@functools.lru_cache(maxsize=None)
def _device_reason():
    """Why nothing can run here, or None. Checked in this process without starting CUDA."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - absent or broken torch alike
        return NO_DEVICE
    return None if torch.cuda.is_available() else NO_DEVICE


@functools.lru_cache(maxsize=None)
def _berth_reason():
    """Why berth_torch cannot be used here, or None. Importing it starts no CUDA."""
    try:
        importlib.import_module("berth_torch")
    except Exception as e:  # noqa: BLE001 - a missing native library is as bad as no package
        return f"berth_torch not importable ({type(e).__name__}: {e}); install the wheel"
    return None


@functools.lru_cache(maxsize=None)
def _run(check, alloc):
    # Cached: train_losses under default runs once, for its own test and for the comparisons.
    return run_compat.run_one(check, alloc, TIMEOUT_S)


@pytest.mark.parametrize("alloc", ALLOCATORS)
@pytest.mark.parametrize("check", CHECKS)
def test_compat(check, alloc):
    reason = _device_reason()
    if reason:
        pytest.skip(reason)
    if alloc != "default":
        reason = _berth_reason()
        if reason:
            pytest.skip(reason)
    rec = _run(check, alloc)
    if rec["verdict"] == "skip":
        pytest.skip(rec["detail"])
    # A berth policy's documented refusal (checked to say why and what to do instead) is its
    # answer; PyTorch's default never refuses.
    ok = ("pass",) if alloc == "default" else ("pass", "refused")
    assert rec["verdict"] in ok, f"{check} under {alloc}: {rec['verdict']}: {rec['detail']}"
    if check == "train_losses" and alloc != "default":
        ref = _run(check, "default")
        if ref["verdict"] != "pass":
            pytest.skip(f"default's train_losses did not pass ({run_compat.short(ref['detail'])})")
        why = run_compat.compare_losses(run_compat.parse_losses(rec["detail"]),
                                        run_compat.parse_losses(ref["detail"]))
        assert why is None, f"{why}: {alloc} {rec['detail']} vs default {ref['detail']}"
