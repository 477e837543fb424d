"""berth_torch.use_allocator where PyTorch is missing (newcomer defect 20): an unknown policy is
the documented ValueError, and a known one an ImportError saying berth_torch needs PyTorch, not
a bare ModuleNotFoundError.

Runs the package's Python code alone: ``berth_torch._native`` (the compiled module) is replaced by
a stand-in that knows the policy names, and ``import torch`` is made to fail as it does where
PyTorch is not installed (``sys.modules["torch"] = None`` raises ModuleNotFoundError).
Usage: python3 no_torch.py <the crate's python/ folder>
"""
import os
import sys
import types

sys.path.insert(0, sys.argv[1])
os.environ.pop("BERTH_TORCH_ALLOCATOR", None)
native = types.ModuleType("berth_torch._native")
native.POLICY_NAMES = ["pytorch", "expandable", "paged"]
native.warnings_said = lambda: []
native.install = lambda policy, options: None
sys.modules["berth_torch._native"] = native
sys.modules["torch"] = None  # `import torch` raises ModuleNotFoundError, as without PyTorch

import berth_torch  # noqa: E402

try:
    berth_torch.use_allocator("bogus")
    raise SystemExit("use_allocator('bogus') returned")
except ValueError as e:
    assert "unknown berth allocator policy 'bogus'" in str(e), e
    assert "'paged'" in str(e), e

try:
    berth_torch.use_allocator("paged")
    raise SystemExit("use_allocator('paged') returned without PyTorch")
except ImportError as e:
    msg = str(e)
    assert "PyTorch" in msg and "install" in msg, msg
    assert "use_allocator" in msg, msg

print("no torch: ok")
