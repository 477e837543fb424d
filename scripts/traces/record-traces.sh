#!/usr/bin/env bash
# scripts/traces/record-traces.sh: on the GPU machine, records the allocator traces of
# scripts/traces/record_traces.py's programs with PyTorch's default allocator, and PyTorch's own
# figures for each program under its three modes (default, expandable_segments:True,
# backend:cudaMallocAsync), each in its own process, up to $JOBS processes at once (the figures
# are per process, so sharing the GPU changes none of them; no timings are taken here).
# Writes $OUT/figures.jsonl (one JSON line per program and mode) and $OUT/traces.tar (the
# *.trace.json.gz files), and $OUT/record.err.
# usage: OUT=/tmp/out [WORKLOADS="..."] [JOBS=6] bash scripts/traces/record-traces.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/traces"
PY=scripts/traces/record_traces.py
WORKLOADS=${WORKLOADS:-$(python3 "$PY" list)}
run_one() {  # workload mode
  local w=$1 mode=$2 conf="" rec=()
  case $mode in
    default) rec=(record) ;;
    expandable) conf=expandable_segments:True ;;
    async) conf=backend:cudaMallocAsync ;;
  esac
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout 400 python3 "$PY" "$w" "$OUT/traces" "${rec[@]}" \
    2>>"$OUT/record.err" | tail -1
}
export -f run_one; export OUT PY
for w in $WORKLOADS; do for m in default expandable async; do echo "$w $m"; done; done |
  xargs -P "${JOBS:-6}" -L 1 bash -c 'run_one "$0" "$1" >> "$OUT/figures.jsonl"'
(cd "$OUT/traces" && tar cf "$OUT/traces.tar" ./*.trace.json.gz)
ls -la "$OUT/traces"
cut -c1-200 "$OUT/figures.jsonl"
