#!/usr/bin/env bash
# scripts/torch-compat.sh: berth_torch's compatibility suite on the GPU machine. Installs the
# berth_torch wheel staged in .gpu/ (by scripts/gpu-check.sh) into the current python unless
# berth_torch already imports, then runs crates/berth-torch/tests/compat/run_compat.py: every
# check (CUDA graphs, torch.compile, MemPool, memory stats and snapshots, empty_cache, memory
# fraction, pinned DataLoader, NCCL, CUDA IPC, threads and streams, training losses, OOM) under
# PyTorch's default allocator and each berth policy, each in its own process. Writes
# OUT/compat.jsonl, OUT/logs/ and the Markdown table OUT/compat.md (also printed); then
# refused_swap.py (a swap PyTorch refuses leaves nothing installed) into OUT/refused_swap.jsonl.
#
# Usage: bash scripts/torch-compat.sh [OUT]       (OUT default: /tmp/compat)
# Env:   PYTHON (default python3); BERTH_TORCH_ALLOCATORS, COMPAT_CHECKS (comma/space
#        separated) and COMPAT_TIMEOUT (seconds per process) narrow or tune the run.
# Exit:  run_compat.py's: 1 when a berth cell fails where default passes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/compat}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}

if ! "$PY" -c 'import berth_torch' 2>/dev/null; then
  whl=$(ls -t .gpu/berth_torch-*.whl 2>/dev/null | head -1)
  if [ -z "$whl" ]; then
    echo "berth_torch is not importable and no .gpu/berth_torch-*.whl is staged" \
      "(scripts/gpu-check.sh builds it); the berth columns will be skips" >&2
  else
    # Filtered of pip's root/notice warnings; success is judged by the import below.
    "$PY" -m pip install -q --no-deps --no-index --force-reinstall "$whl" 2>&1 \
      | grep -v -e WARNING -e notice
  fi
  # A python that refuses installs (an externally managed environment): install beside it
  # and put that folder on the path of this run and its children.
  if [ -n "$whl" ] && ! "$PY" -c 'import berth_torch' 2>/dev/null; then
    site=/tmp/berth-compat-site
    rm -rf "$site" && "$PY" -m pip install -q --no-deps --no-index --target "$site" "$whl" 2>&1 \
      | grep -v -e WARNING -e notice
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi

args=(--out "$OUT")
[ -n "${COMPAT_CHECKS:-}" ] && args+=(--checks "$COMPAT_CHECKS")
[ -n "${COMPAT_TIMEOUT:-}" ] && args+=(--timeout "$COMPAT_TIMEOUT")
"$PY" crates/berth-torch/tests/compat/run_compat.py "${args[@]}" | tee "$OUT/compat.md"
rc=${PIPESTATUS[0]}
# A refused swap leaves nothing installed (three triggers x full and pluggable paths).
if [ -z "${COMPAT_CHECKS:-}" ] || [[ "${COMPAT_CHECKS}" == *refused_swap* ]]; then
  "$PY" crates/berth-torch/tests/compat/refused_swap.py | tee "$OUT/refused_swap.jsonl"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
# Sleep and wake through the installed package, over a simulated device (no GPU needed).
if [ -z "${COMPAT_CHECKS:-}" ]; then
  "$PY" crates/berth-torch/tests/sleep_smoke.py 2>&1 | tail -1 | tee "$OUT/sleep_smoke.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit "$rc"
