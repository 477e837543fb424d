#!/usr/bin/env bash
# scripts/torch-live.sh: berth's allocators under live PyTorch, on the GPU machine, in one call.
# Installs the berth_torch wheel from .gpu/, compiles the trivial C allocator (PyTorch's wrapper
# cost alone), runs ../shared/bench/torch_live.py (staged in .gpu/shared/bench; its five
# workloads) or scripts/torch_live/live_programs.py (every other workload) for each workload
# with each allocator in its own process, then the record_stream / OOM / errors /
# snapshot checks, and writes $OUT/live.jsonl, $OUT/checks.jsonl and the table $OUT/live-table.md.
#
# Staging (here, no GPU): scripts/gpu-check.sh (builds the wheel into .gpu/ too).
# Run (GPU machine): OUT=... WORKLOADS="two_stream_pipeline resnet50_train" scripts/torch-live.sh
# Env: WORKLOADS (default: all five; `all` = the five and every program of
#      scripts/torch_live/live_programs.py, which runs any name not among the five),
#      ALLOCATORS (default: default expandable berth:pytorch
#      berth:paged berth:trivial), CHECKS=0 to skip the checks, STEPS (torch_live's --steps),
#      ROUNDS (default 1: each allocator once), HOOK_COST=1 for the per-call cost, PIN (cores).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA=${CUDA_HOME:-/usr/local/cuda}
WORKLOADS=${WORKLOADS:-two_stream_pipeline resnet50_train gpt2_train bert_varlen_train gpt2_generate}
ALLOCATORS=${ALLOCATORS:-default expandable berth:pytorch berth:paged berth:trivial}
LIVE=.gpu/shared/bench/torch_live.py
PROGRAMS=scripts/torch_live/live_programs.py
FIVE="two_stream_pipeline resnet50_train gpt2_train bert_varlen_train gpt2_generate"
if [ "$WORKLOADS" = all ]; then
  programs=$(python3 $PROGRAMS list) || { echo "$PROGRAMS list failed" >&2; exit 1; }
  WORKLOADS="$FIVE $programs"
fi
SITE=/tmp/berth-site
rm -rf "$SITE" && python3 -m pip install -q --no-index --no-deps --target "$SITE" .gpu/berth_torch-*.whl 2>&1 | grep -v WARNING
gcc -O2 -shared -fPIC scripts/torch_live/trivial_alloc.c -o /tmp/trivial_alloc.so -I"$CUDA/include" \
  -L"$CUDA/lib64" -lcudart -lpthread 2>>"$OUT/live.err" || echo "trivial_alloc.c did not build" >&2
export TRIVIAL_ALLOC_SO=/tmp/trivial_alloc.so
steps=(); [ -n "${STEPS:-}" ] && steps=(--steps "$STEPS")
# ROUNDS > 1 runs every allocator once per round, the order rotated each round, so slow drift
# of the card (clocks, temperature) falls on every allocator alike; live_table.py then gives
# medians over rounds and the median of the per-round ratios to the default.
# PIN=<cpu list> runs every process under `taskset -c PIN` (the GPU's local cores, from
# `nvidia-smi topo -m`), so no process lands on a core or NUMA node the others did not.
pin=(); [ -n "${PIN:-}" ] && pin=(taskset -c "$PIN")
read -r -a alloc_list <<< "$ALLOCATORS"
n=${#alloc_list[@]}
for ((r = 0; r < ${ROUNDS:-1}; r++)); do
  for w in $WORKLOADS; do
    for ((k = 0; k < n; k++)); do
      a=${alloc_list[$(((k + r) % n))]}
      path=$SITE; [ "$a" = berth:trivial ] && path=scripts/torch_live/trivial_shim
      script=$PROGRAMS; [[ " $FIVE " == *" $w "* ]] && script=$LIVE
      PYTHONPATH=$path timeout 300 "${pin[@]}" python3 "$script" "$w" --allocator "$a" "${steps[@]}" \
        2>>"$OUT/live.err" | tail -1 | sed "s/^{/{\"round\": $r, /" | tee -a "$OUT/live.jsonl" | cut -c1-160
    done
  done
done
# HOOK_COST=1: ns per raw_delete + raw_alloc pair through c10's allocator object under each
# allocator (scripts/torch_live/hook_cost.{cpp,py}), and resnet50_train's allocations per step.
if [ "${HOOK_COST:-0}" = 1 ]; then
  inc=$(python3 -c 'import torch.utils.cpp_extension as c; print(" ".join("-I" + p for p in c.include_paths()))')
  lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  g++ -O2 -std=c++17 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI="$abi" $inc -I"$CUDA/include" \
    scripts/torch_live/hook_cost.cpp -o /tmp/hook_cost.so -L"$lib" -lc10 -lc10_cuda \
    2>>"$OUT/live.err" || echo "hook_cost.cpp did not build (see live.err)" >&2
  for a in default berth:pytorch berth:paged berth:trivial default berth:pytorch berth:paged berth:trivial; do
    path=$SITE; [ "$a" = berth:trivial ] && path=scripts/torch_live/trivial_shim
    count=(); [ "$a" = default ] && count=(--count-resnet50)
    PYTHONPATH=$path LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" timeout 300 \
      "${pin[@]}" python3 scripts/torch_live/hook_cost.py "$a" /tmp/hook_cost.so "${count[@]}" \
      2>>"$OUT/live.err" | tail -1 | tee -a "$OUT/hook_cost.jsonl"
  done
fi
if [ "${CHECKS:-1}" = 1 ]; then
  C=scripts/torch_live/berth_torch_checks.py
  for p in default pytorch paged; do
    PYTHONPATH=$SITE timeout 120 python3 $C record_stream $p 50 2>>"$OUT/live.err" | tee -a "$OUT/checks.jsonl" | cut -c1-200
  done
  for p in pytorch paged; do
    PYTHONPATH=$SITE timeout 120 python3 $C oom $p 2>>"$OUT/live.err" | tee -a "$OUT/checks.jsonl" | cut -c1-200
  done
  PYTHONPATH=$SITE timeout 120 python3 $C errors 2>>"$OUT/live.err" | tee -a "$OUT/checks.jsonl" | cut -c1-200
  PYTHONPATH=$SITE timeout 120 python3 $C late 2>>"$OUT/live.err" | tee -a "$OUT/checks.jsonl" | cut -c1-200
  PYTHONPATH=$SITE timeout 300 python3 $C snapshot paged "$OUT" "$LIVE" 2>>"$OUT/live.err" | tail -1 | tee -a "$OUT/checks.jsonl" | cut -c1-300
  rm -f "$OUT"/*.html  # checked by size in checks.jsonl; too big to bring back
fi
python3 scripts/torch_live/live_table.py "$OUT/live.jsonl" > "$OUT/live-table.md"
cat "$OUT/live-table.md"
