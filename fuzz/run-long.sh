#!/usr/bin/env bash
# Long fuzz runs on a machine without Rust: every prebuilt target of BIN_DIR, in parallel,
# for a time or a number of runs, with the committed seeds. Writes one summary line per
# target into OUT_DIR/summary.log (with the final `#N DONE ... exec/s` line of each job) and
# keeps crashes under OUT_DIR/<target>/artifacts/.
#
# Usage: run-long.sh BIN_DIR [-t SECONDS | -r RUNS] [-j JOBS_PER_TARGET] [-s SEEDS_DIR] [-o OUT_DIR]
#   BIN_DIR   the fuzz binaries (what `cargo +nightly fuzz build -O -a` leaves in
#             fuzz/target/x86_64-unknown-linux-gnu/release/: abi_expandable, abi_paged, ...)
#   -t        seconds per target (default 3600), or
#   -r        total runs per target, split over its jobs
#   -j        parallel jobs per target (default: cores / targets, at least 1)
#   -s        the seed corpus (default: seeds/ next to this script)
#   -o        output directory (default: ./fuzz-long-<date>)
# Exit status: 1 when any target crashed, else 0.
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
bin_dir="$(cd "$1" && pwd)"; shift
seconds=3600 runs="" jobs="" seeds="$(cd "$(dirname "$0")" && pwd)/seeds" out=""
while getopts "t:r:j:s:o:" opt; do
    case "$opt" in
        t) seconds="$OPTARG" ;;
        r) runs="$OPTARG" ;;
        j) jobs="$OPTARG" ;;
        s) seeds="$(cd "$OPTARG" && pwd)" ;;
        o) out="$OPTARG" ;;
        *) usage ;;
    esac
done
out="${out:-fuzz-long-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"

targets=()
for f in "$bin_dir"/*; do
    [ -f "$f" ] && [ -x "$f" ] && [ -d "$seeds/$(basename "$f")" ] && targets+=("$(basename "$f")")
done
[ "${#targets[@]}" -gt 0 ] || { echo "no fuzz binaries with seeds under $seeds found in $bin_dir" >&2; exit 2; }
cores="$(nproc)"
jobs="${jobs:-$(( cores / ${#targets[@]} > 0 ? cores / ${#targets[@]} : 1 ))}"
if [ -n "$runs" ]; then
    limit=(-runs="$(( (runs + jobs - 1) / jobs ))")
    what="$runs runs"
else
    limit=(-max_total_time="$seconds")
    what="${seconds}s"
fi
echo "fuzzing ${#targets[@]} targets (${targets[*]}), $jobs jobs each, $what per target, output in $out"

for t in "${targets[@]}"; do
    mkdir -p "$out/$t/corpus" "$out/$t/artifacts"
    (
        cd "$out/$t"
        "$bin_dir/$t" corpus "$seeds/$t" -jobs="$jobs" -workers="$jobs" "${limit[@]}" \
            -rss_limit_mb=2048 -timeout=30 -artifact_prefix=artifacts/ >run.log 2>&1 || true
    ) &
done
wait

summary="$out/summary.log"
crashed=0
{
    printf '%-16s %5s %14s %9s %12s %8s\n' target jobs executions seconds exec/s crashes
    for t in "${targets[@]}"; do
        logs=("$out/$t"/fuzz-*.log)
        [ -e "${logs[0]}" ] || logs=("$out/$t/run.log")
        execs=0 secs=0
        while read -r n s; do
            execs=$((execs + n)); [ "$s" -gt "$secs" ] && secs=$s
        done < <(grep -hE '^Done [0-9]+ runs in [0-9]+ second' "${logs[@]}" | awk '{print $2, $5}')
        crashes=$(find "$out/$t/artifacts" -type f | wc -l)
        [ "$crashes" -eq 0 ] || crashed=1
        rate=$([ "$secs" -gt 0 ] && echo $((execs / secs)) || echo 0)
        printf '%-16s %5s %14s %9s %12s %8s\n' "$t" "$jobs" "$execs" "$secs" "$rate" "$crashes"
    done
    echo
    echo "final stats line of each job:"
    for t in "${targets[@]}"; do
        # With -jobs each job logs to fuzz-N.log (run.log repeats them); else run.log only.
        logs=("$out/$t"/fuzz-*.log)
        [ -e "${logs[0]}" ] || logs=("$out/$t/run.log")
        for log in "${logs[@]}"; do
            [ -e "$log" ] || continue
            line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
            [ -z "$line" ] || echo "$t $(basename "$log"): $line"
        done
    done
    echo
    echo "crashes:"
    find "$out" -path '*/artifacts/*' -type f | sed 's/^/  /'
} | tee "$summary"
exit "$crashed"
