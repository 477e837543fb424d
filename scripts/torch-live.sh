#!/usr/bin/env bash
# scripts/torch-live.sh: berth's allocators under live PyTorch, on the GPU machine, in one call.
# Installs the berth_torch wheel from .gpu/, compiles the trivial C allocator (PyTorch's wrapper
# cost alone), runs ../shared/bench/torch_live.py (staged in .gpu/shared/bench) for each
# workload with each allocator in its own process, then the record_stream / OOM / errors /
# snapshot checks, and writes $OUT/live.jsonl, $OUT/checks.jsonl and the table $OUT/live-table.md.
#
# Staging (here, no GPU): scripts/gpu-check.sh (builds the wheel into .gpu/ too).
# Run (GPU machine): OUT=... WORKLOADS="two_stream_pipeline resnet50_train" scripts/torch-live.sh
# Env: WORKLOADS (default: all five), ALLOCATORS (default: default expandable berth:pytorch
#      berth:paged berth:trivial), CHECKS=0 to skip the checks, STEPS (torch_live's --steps).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CUDA=${CUDA_HOME:-/usr/local/cuda}
WORKLOADS=${WORKLOADS:-two_stream_pipeline resnet50_train gpt2_train bert_varlen_train gpt2_generate}
ALLOCATORS=${ALLOCATORS:-default expandable berth:pytorch berth:paged berth:trivial}
LIVE=.gpu/shared/bench/torch_live.py
SITE=/tmp/berth-site
rm -rf "$SITE" && python3 -m pip install -q --no-index --no-deps --target "$SITE" .gpu/berth_torch-*.whl 2>&1 | grep -v WARNING
gcc -O2 -shared -fPIC scripts/torch_live/trivial_alloc.c -o /tmp/trivial_alloc.so -I"$CUDA/include" \
  -L"$CUDA/lib64" -lcudart -lpthread 2>>"$OUT/live.err" || echo "trivial_alloc.c did not build" >&2
export TRIVIAL_ALLOC_SO=/tmp/trivial_alloc.so
steps=(); [ -n "${STEPS:-}" ] && steps=(--steps "$STEPS")
for w in $WORKLOADS; do
  for a in $ALLOCATORS; do
    path=$SITE; [ "$a" = berth:trivial ] && path=scripts/torch_live/trivial_shim
    PYTHONPATH=$path timeout 300 python3 "$LIVE" "$w" --allocator "$a" "${steps[@]}" \
      2>>"$OUT/live.err" | tail -1 | tee -a "$OUT/live.jsonl" | cut -c1-160
  done
done
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
