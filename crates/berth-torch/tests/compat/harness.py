"""What every compatibility check uses: the registry of checks, the verdicts a check can end
with besides pass and fail, and the step marker a failure names. Imports no torch, so
`checks.py --list` answers where torch is not installed."""

MiB = 1 << 20
GiB = 1 << 30
CHECKS = {}
_STEP = ["start"]  # the step a check is in; a fail names it on its first line


class Skip(Exception):
    """The check cannot run here (a missing optional package, an API this torch lacks)."""


class Refused(Exception):
    """The allocator refuses what the check asks, with its reason and what to do instead, where
    that is the documented answer of this policy (the table shows the reason, not a pass)."""


def check(fn):
    """Registers a check under its function name, without the `check_` prefix."""
    CHECKS[fn.__name__[len("check_"):]] = fn
    return fn


def step(name):
    """Marks the step a check is in, so a failure says where it happened."""
    _STEP[0] = name


def expect(cond, msg):
    """assert that also runs under `python -O`."""
    if not cond:
        raise AssertionError(msg)


def cuda():
    """The current CUDA device."""
    import torch
    return torch.device("cuda", torch.cuda.current_device())


def driver_used_bytes():
    """Bytes in use on the device as the driver counts them (every process, every allocator)."""
    import torch
    free, total = torch.cuda.mem_get_info()
    return total - free
