"""A refused allocator swap leaves nothing installed (run on a machine with a GPU and PyTorch).

PyTorch refuses to swap its CUDA allocator once the allocator is in use, and some calls put it
in use while ``torch.cuda.is_initialized()`` is still False (pytorch/pytorch#140687):
``torch.cuda.current_device()``, ``torch.cuda.get_device_capability()`` and pinning a host
tensor. For each of them, in a fresh process, under the full allocator and under the pluggable
fallback (``BERTH_TORCH_PLUGGABLE=1``): ``berth_torch.use_allocator("paged")`` must raise
``RuntimeError`` saying what to do, ``berth_torch.installed_policy()`` must be None afterwards,
and PyTorch's own allocator must keep working (where PyTorch accepts the swap instead, berth must
then be the installed policy). A fresh process that calls ``use_allocator``
first must then succeed (the swap is refused for the state, not forever).

usage: python3 refused_swap.py    prints one JSON line per case (one "skip" line without a
GPU); exit status 1 if any fails. scripts/torch-compat.sh runs it after the suite.
"""
import json
import os
import subprocess
import sys

TRIGGERS = {
    "current_device": "torch.cuda.current_device()",
    "get_device_capability": "torch.cuda.get_device_capability()",
    "pin_memory": "torch.ones(4).pin_memory()",
    "nothing (the swap must succeed)": "",
}

CHILD = r'''
import json, sys, torch, berth_torch
trigger = sys.argv[1]
if trigger:
    exec(trigger)
result = {"is_initialized_before": torch.cuda.is_initialized()}
try:
    berth_torch.use_allocator("paged")
    result["raised"] = None
except RuntimeError as e:
    result["raised"] = str(e)
result["installed_policy"] = berth_torch.installed_policy()
t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
result["sum_ok"] = float(t.sum()) == float((1 << 20) * ((1 << 20) - 1) // 2)
try:
    result["torch_allocated"] = torch.cuda.memory_allocated()
except RuntimeError as e:  # PyTorch's pluggable wrapper has no statistics (berth_torch's do)
    result["torch_allocated"] = None
    result["berth_allocated"] = berth_torch.memory_allocated()
print(json.dumps(result))
'''


def run_case(trigger_name, code, pluggable):
    env = dict(os.environ)
    env.pop("BERTH_TORCH_ALLOCATOR", None)
    if pluggable:
        env["BERTH_TORCH_PLUGGABLE"] = "1"
    else:
        env.pop("BERTH_TORCH_PLUGGABLE", None)
    p = subprocess.run([sys.executable, "-c", CHILD, code], env=env, capture_output=True,
                       text=True, timeout=300)
    case = {"trigger": trigger_name, "path": "pluggable" if pluggable else "full"}
    try:
        got = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        case.update(verdict="fail", detail=f"rc {p.returncode}: {p.stderr[-800:]}")
        return case
    case.update(got)
    if got["raised"] is not None:
        # Refused: a message saying what to do, nothing installed, PyTorch's allocator works.
        ok = code != "" and "import torch" in got["raised"] and got["installed_policy"] is None
    else:
        # Accepted (PyTorch allowed the swap in this state): berth answers.
        ok = got["installed_policy"] == "paged"
    ok = ok and got["sum_ok"]
    case["verdict"] = "pass" if ok else "fail"
    return case


def main():
    import torch
    if not torch.cuda.is_available():
        print(json.dumps({"verdict": "skip", "detail": "no CUDA device"}))
        return 0
    failed = 0
    for pluggable in (False, True):
        for name, code in TRIGGERS.items():
            case = run_case(name, code, pluggable)
            failed += case["verdict"] != "pass"
            print(json.dumps(case), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
