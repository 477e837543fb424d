#!/usr/bin/env bash
# scripts/ci/torch_allocator.sh: checks that berth_torch's C++ allocator
# (crates/berth-torch/python/berth_torch/csrc/allocator.cpp, `Note [The full allocator]`) compiles
# against the PyTorch installed here, as the Python package compiles it at first use. Skips,
# saying why, where PyTorch or the CUDA headers are missing (CI without PyTorch); the GPU
# machine builds and runs it for real through scripts/torch-compat.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if ! "$PY" -W ignore -c 'import torch' >/dev/null 2>&1; then
    echo "   skipped: PyTorch is not installed here (pip install torch to check the C++ allocator; the GPU machine builds it in scripts/torch-compat.sh)"
    exit 0
fi
# PyTorch's include folders, Python's, and the CUDA runtime headers: CUDA_HOME's, else the ones
# of PyTorch's pip CUDA packages (nvidia/cu*/include).
mapfile -t inc < <("$PY" -W ignore - <<'PY'
import glob, os, site, sysconfig
from torch.utils import cpp_extension
dirs = cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]
home = os.environ.get("CUDA_HOME") or cpp_extension.CUDA_HOME
cands = [os.path.join(home, "include")] if home else []
for sp in site.getsitepackages():
    cands += sorted(glob.glob(os.path.join(sp, "nvidia", "cu*", "include")))
    cands += sorted(glob.glob(os.path.join(sp, "nvidia", "cuda_runtime", "include")))
cuda = next((c for c in cands if os.path.exists(os.path.join(c, "cuda_runtime_api.h"))
             and os.path.exists(os.path.join(c, "crt", "host_config.h"))), None)
print("\n".join(dirs + ([cuda] if cuda else ["MISSING-CUDA"])))
PY
)
if [ "${inc[-1]}" = MISSING-CUDA ]; then
    echo "   skipped: no CUDA runtime headers found (set CUDA_HOME, or pip install nvidia-cuda-runtime nvidia-cuda-crt)"
    exit 0
fi
std=c++17
"$PY" -W ignore -c 'import torch, sys; v = tuple(map(int, torch.__version__.split(".")[:2])); sys.exit(0 if v >= (2, 12) else 1)' && std=c++20
args=(); for d in "${inc[@]}"; do args+=(-I"$d"); done
${CXX:-g++} -std=$std -fsyntax-only -Wall -Werror -DTORCH_EXTENSION_NAME=berth_torch_allocator \
    -DTORCH_API_INCLUDE_EXTENSION_H "${args[@]}" crates/berth-torch/python/berth_torch/csrc/allocator.cpp
echo "   ok: csrc/allocator.cpp compiles against torch $("$PY" -W ignore -c 'import torch; print(torch.__version__)')"
