#!/usr/bin/env bash
# scripts/gpu-check.sh: build berth's release binaries and GPU test executables HERE (no GPU
# needed), stage them with PyTorch's scripts and the traces in .gpu/ (git-ignored), and print
# the one command to run on the GPU machine. That single run executes every test, the
# #[ignore]d GPU tests included (--include-ignored), with BERTH_REQUIRE_GPU=1, berth's GPU benches, and PyTorch's baseline scripts side by side,
# writing logs and one comparison table to $OUT.
#
# Usage: scripts/gpu-check.sh            (then run the printed command with carry [".gpu"])
# Env:   CARGO_TARGET_DIR (default target/gpu-check), SHARED (default ../shared or /work/shared),
#        BERTH_ONLY=1 (stage the berth binary and the shared scripts only: no test executables,
#        no criterion bench, no wheel; enough for PARTS='loader train bench seeds')
set -euo pipefail
cd "$(dirname "$0")/.."
# Absolute, so that the wheel build (run from crates/berth-torch) shares this target directory.
export CARGO_TARGET_DIR="$(realpath -m "${CARGO_TARGET_DIR:-target/gpu-check}")"
SHARED="${SHARED:-$( [ -d ../shared ] && echo ../shared || echo /work/shared )}"

echo "== building release binaries into $CARGO_TARGET_DIR" >&2
cargo build --release -p berth-cli >&2
# Executables found through cargo's JSON: the test binaries of berth-cuda and berth (the GPU
# tests) and berth-data (pinned collate and the device prefetcher), and berth-alloc's criterion bench.
executables() {
  python3 -c 'import json,sys
for l in sys.stdin:
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] != ["bin"]:
        print(m["package_id"].split("#")[0].split("/")[-1].split("@")[0] + "-" + m["target"]["name"] + "\t" + m["executable"])'
}
TESTS=(); BENCHES=()
# The main job's CPU step op by op (issue 15), for PARTS=loader: small, so staged always.
CPU_STEP=$(cargo bench -p berth --bench cpu_step --no-run --message-format=json 2>/dev/null | executables | cut -f2)
if [ "${BERTH_ONLY:-0}" != 1 ]; then
mapfile -t TESTS < <(cargo test --release -p berth-cuda -p berth -p berth-data -p berth-distributed --no-run --message-format=json 2>/dev/null | executables)
mapfile -t BENCHES < <(cargo bench -p berth-alloc --bench replay --no-run --message-format=json 2>/dev/null | executables)
fi

rm -rf .gpu && mkdir -p .gpu/shared
cp "$CARGO_TARGET_DIR/release/berth" .gpu/berth
for t in ${TESTS[@]+"${TESTS[@]}"}; do
  name="${t%%$'\t'*}"; exe="${t#*$'\t'}"
  case "$name" in *-tour) continue ;; esac   # the API tour (docs/tour.md) runs in CI, no GPU part
  cp "$exe" ".gpu/test-$name"
done
for b in ${BENCHES[@]+"${BENCHES[@]}"}; do
  cp "${b#*$'\t'}" .gpu/bench-alloc-replay
done
cp "$CPU_STEP" .gpu/bench-cpu-step
cp -r "$SHARED/bench" "$SHARED/traces" .gpu/shared/
# Every committed trace (the five of ../shared/traces and the fifteen recorded since) replays.
cp crates/berth-alloc/tests/data/*.trace.json.gz .gpu/shared/traces/
# The berth_torch wheel (PyTorch's allocator from berth), for scripts/torch-live.sh.
if [ "${BERTH_ONLY:-0}" != 1 ]; then
  command -v maturin >/dev/null || python3 -m pip install -q maturin >&2
  (cd crates/berth-torch && maturin build --release --out "$OLDPWD/.gpu" >&2)
fi
# What travels to the GPU machine is capped at 64 MiB with the work tree: drop symbols.
strip .gpu/berth .gpu/test-* .gpu/bench-* 2>/dev/null || true
# Stripped, they are still about 90 MB beside the ~42 MB work tree: xz them (about 4x smaller);
# run.sh unpacks them on the GPU machine before anything else.
xz -T0 -6 -f .gpu/berth .gpu/test-* .gpu/bench-*

cat > .gpu/run.sh <<'EOF'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root; writes everything under $OUT.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# The executables travel xz-compressed (gpu-check.sh); python's lzma needs no xz binary.
python3 - <<'PY'
import glob, lzma, os, shutil
for packed in glob.glob(".gpu/*.xz"):
    with lzma.open(packed) as src, open(packed[:-3], "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(packed[:-3], 0o755)
    os.remove(packed)
PY
# The tests find their data through paths compiled in (CARGO_MANIFEST_DIR of the build here):
# where that folder does not exist on this machine, point it at this checkout.
BUILT_AT=__BUILT_AT__
if [ ! -e "$BUILT_AT" ] && mkdir -p "$(dirname "$BUILT_AT")" 2>/dev/null; then ln -sfn "$PWD" "$BUILT_AT"; fi
# PARTS picks what runs (by default all but loader and accounting), so the work can be split
# over several calls of at most 10 minutes each: tests bench train replay alloc torch seeds
# live profile loader accounting (live:
# PyTorch programs on berth's allocators through the berth_torch wheel, scripts/torch-live.sh;
# profile: berth train with and without --profile, scripts/profile-overlap.py; loader: issue 15's
# DataLoader sweep and the main job on CPU and GPU beside PyTorch, one table).
PARTS=" ${PARTS:-tests bench train replay alloc torch seeds live profile} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
.gpu/berth info | tee "$OUT/info.txt"
status=0
touch "$OUT/tests.log" "$OUT/berth-bench.jsonl"
if want tests; then
  for t in .gpu/test-*; do
    echo "== $t" >> "$OUT/tests.log"
    # GPU tests are #[ignore]d (a machine without a GPU counts them as ignored, not passed):
    # --include-ignored runs them, and BERTH_REQUIRE_GPU=1 fails any that finds no GPU.
    BERTH_REQUIRE_GPU=1 "$t" --include-ignored --test-threads=1 >> "$OUT/tests.log" 2>&1 || status=1
    tail -1 "$OUT/tests.log"
  done
  grep -h -E "^== |^test result|FAILED|panicked" "$OUT/tests.log" > "$OUT/tests-summary.txt" || true
fi
# Honest accounting (issue 28): the GPU accounting test, the handle-size bandwidth, the
# identity on every committed trace through replay --device, and berth_torch.memory_summary's
# driver lines. Small, so a live run can follow in the same call.
if want accounting; then
  for t in .gpu/test-berth-cuda-accounting .gpu/test-berth-cuda-berth_cuda; do
    # One test at a time: they read the device-wide cuMemGetInfo.
    BERTH_REQUIRE_GPU=1 timeout 300 "$t" --include-ignored --nocapture --test-threads=1 \
      reserved_equals large_handles mappings_are >> "$OUT/accounting.log" 2>&1 || status=1
  done
  timeout 300 .gpu/berth replay --device cuda:0 --policy all .gpu/shared/traces/*.trace.json.gz \
    >> "$OUT/accounting.log" 2>&1 || status=1
  if python3 -c 'import torch' 2>/dev/null; then
    rm -rf /tmp/berth-site && python3 -m pip install -q --no-index --no-deps --target /tmp/berth-site .gpu/berth_torch-*.whl 2>&1 | grep -v WARNING
    PYTHONPATH=/tmp/berth-site timeout 120 python3 -c '
import berth_torch, torch
berth_torch.use_allocator("paged")
xs = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (3, 50, 700, 5)]
del xs[1]
print(berth_torch.memory_summary(abbreviated=True))' >> "$OUT/accounting.log" 2>&1 || status=1
  fi
fi
if want bench; then
  for b in transfers alloc overlap sync; do
    timeout 120 .gpu/berth bench "$b" --json 2>>"$OUT/bench.err" | tee -a "$OUT/berth-bench.jsonl"
  done
fi
# The main job on the GPU (auto picks cuda:0), the meta prediction beside it, and the
# DataLoader to the GPU.
if want train; then
# Per allocator policy: the default (berth's paged), PyTorch's policy, PyTorch's expandable
# segments; each GPU run beside its meta prediction, and a memory snapshot of the default's;
# then the same with --resident (the split on the device; 1 epoch), beside its prediction.
for conf in "" "backend:native" "expandable_segments:True" \
            "resident" "resident backend:native" "resident expandable_segments:True"; do
  res=(); epochs=5
  if [ "${conf#resident}" != "$conf" ]; then res=(--resident); epochs=1; conf=${conf#resident}; conf=${conf# }; fi
  tag=${conf:-default}; tag=${tag//[:]/-}; tag=$tag${res:+-resident}
  snap=(); [ -z "$conf" ] && [ -z "${res[*]}" ] && snap=(--memory-snapshot "$OUT/train-default.snapshot.pickle")
  BERTH_ALLOC_CONF=$conf timeout 300 .gpu/berth train --device auto --epochs $epochs --json "${res[@]}" "${snap[@]}" > "$OUT/train-cuda-$tag.json" 2>"$OUT/train-cuda-$tag.err" || status=1
  BERTH_ALLOC_CONF=$conf timeout 60 .gpu/berth train --device meta --json "${res[@]}" > "$OUT/train-meta-$tag.json" 2>>"$OUT/train-cuda-$tag.err" || status=1
  python3 - "$OUT" "$tag" <<'PY' | tee -a "$OUT/train-policies.jsonl"
import json, os, sys
out, tag = sys.argv[1], sys.argv[2]
try:
    g = json.load(open(os.path.join(out, f"train-cuda-{tag}.json")))
    m = json.load(open(os.path.join(out, f"train-meta-{tag}.json")))
except Exception as e:
    print(json.dumps({"conf": tag, "error": str(e)})); sys.exit(0)
print(json.dumps({"conf": tag, "policy": g.get("allocator_policy"), "test_accuracy": g["test_accuracy"],
  "epoch_seconds": g["epoch_seconds"], "samples_per_second": g["samples_per_second"],
  "peak_allocated": g["peak_allocated"], "peak_reserved": g["peak_reserved"],
  "reserved_over_allocated": g["peak_reserved"] / max(1, g["peak_allocated"]),
  "meta_allocated": m["peak_allocated"], "meta_reserved": m["peak_reserved"],
  "meta_allocated_error": m["peak_allocated"] / max(1, g["peak_allocated"]) - 1,
  "meta_reserved_error": m["peak_reserved"] / max(1, g["peak_reserved"]) - 1}))
PY
done
if [ "${SKIP_DATALOADER:-0}" != 1 ]; then
  timeout 240 .gpu/berth bench dataloader --json > "$OUT/bench-dataloader.jsonl" 2>"$OUT/bench-dataloader.err" || status=1
  cat "$OUT/bench-dataloader.jsonl"
fi
fi
# Accuracy on the GPU against the CPU over several seeds (the two differ in summation order
# only, so single runs differ by a few tenths of a point either way).
if want seeds; then
  for seed in 1 2 3; do
    for dev in cpu cuda:0; do
      timeout 200 .gpu/berth train --device $dev --seed $seed --epochs 5 --json 2>/dev/null \
        | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'seed': $seed, 'device': '$dev', 'test_accuracy': d.get('test_accuracy'), 'epoch_seconds': d.get('epoch_seconds')}))" \
        | tee -a "$OUT/train-seeds.jsonl" || status=1
    done
  done
fi
# Real traces through berth's allocators on the GPU (one stream, fastest warm pass) and
# PyTorch's own C++ replay of the same traces in the same run: three rounds, alternating, and
# the fastest round of each side is compared (single-thread speed on these shared hosts moves
# by up to 1.7x between runs, for berth and PyTorch alike).
if want replay; then
mkdir -p /tmp/berth-replay-ext
for round in $(seq 1 "${ROUNDS:-3}"); do
  timeout 300 .gpu/berth replay --device cuda:0 --policy all --json .gpu/shared/traces/*.trace.json.gz >> "$OUT/replay-cuda.jsonl" 2>>"$OUT/bench.err" || status=1
  if [ "${SKIP_TORCH:-0}" != 1 ] && python3 -c 'import torch' 2>/dev/null; then
    for conf in "" "expandable_segments:True"; do
      PYTORCH_CUDA_ALLOC_CONF=$conf EXT_DIR=/tmp/berth-replay-ext timeout 300 python3 .gpu/shared/bench/torch_replay.py .gpu/shared/traces/*.trace.json.gz >> "$OUT/torch-replay.jsonl" 2>>"$OUT/torch-baseline.err"
    done
  fi
done
python3 - "$OUT" <<'PY' | tee "$OUT/replay-summary.md"
import collections, json, os, sys
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name)
    for line in (open(p) if os.path.exists(p) else []):
        try: yield json.loads(line)
        except ValueError: pass
berth, torch, calls = collections.defaultdict(list), collections.defaultdict(list), {}
for d in rows("replay-cuda.jsonl"):
    berth[d["trace"], d["policy"]].append(d["ns_per_op"])
    calls[d["trace"], d["policy"]] = (d.get("warm_device_calls"), d.get("reserved_agrees_with_driver"))
for d in rows("torch-replay.jsonl"):
    torch[d["trace"], d["conf"]].append(d["ns_per_op_warm"])
print("| trace | PyTorch default | berth pytorch (ratio) | PyTorch expandable | berth expandable (ratio) | berth paged (ratio to default, warm calls) | reserved == cuMemGetInfo used |")
print("|---|---|---|---|---|---|---|")
m = lambda v: min(v) if v else float("nan")
for t in sorted({k[0] for k in berth}):
    td, te = m(torch.get((t, "default"), [])), m(torch.get((t, "expandable_segments:True"), []))
    bp, be, bg = (m(berth.get((t, p), [])) for p in ("pytorch", "expandable", "paged"))
    ok = all(calls.get((t, p), (0, True))[1] for p in ("pytorch", "expandable", "paged"))
    print(f"| {t} | {td:.1f} | {bp:.1f} ({bp/td:.2f}) | {te:.1f} | {be:.1f} ({be/te:.2f}) | {bg:.1f} ({bg/td:.2f}, {calls.get((t, 'paged'), (None,))[0]}) | {ok} |")
PY
fi
# berth-alloc's criterion bench on this idle many-core host: the five traces (warm cache)
# and the live-blocks sweep (100 / 10k / 100k live blocks). Medians land in criterion's JSON.
if want alloc && [ -x .gpu/bench-alloc-replay ]; then
  BERTH_TRACE_DIR=.gpu/shared/traces timeout 400 .gpu/bench-alloc-replay --bench > "$OUT/bench-alloc.txt" 2>&1 || status=1
  grep -E -B1 "time:" "$OUT/bench-alloc.txt" | grep -v '^--'
fi
# Issue 15 items 3-4 in one call (PARTS=loader): the DataLoader sweep to the GPU and host-only
# beside the parallel memcpy of each thread count, the main job on the CPU and the GPU (loader
# and resident), PyTorch's torch_train.py (both modes, both devices) and the DataLoader part of
# torch_baseline.py, then one summary table. About 4-6 minutes on the H200 host.
if want loader; then
  timeout 200 .gpu/berth bench dataloader --json > "$OUT/loader-bench.jsonl" 2>"$OUT/loader-bench.err" || status=1
  for dev in cpu cuda:0; do
    for mode in loader resident; do
      # --resident: the data set on the device once, batches gathered there (index_select).
      flag=(); [ "$mode" = resident ] && flag=(--resident)
      timeout 150 .gpu/berth train --device $dev --epochs 5 --json "${flag[@]}" > "$OUT/loader-train-${dev/:/}-$mode.json" 2>"$OUT/loader-train-${dev/:/}-$mode.err" || status=1
    done
  done
  # The CPU target's best thread count: the resident CPU run under 4, 8 and 16 rayon threads.
  for n in 4 8 16; do
    RAYON_NUM_THREADS=$n timeout 150 .gpu/berth train --device cpu --epochs 5 --json --resident > "$OUT/loader-train-cpu-resident-t$n.json" 2>"$OUT/loader-train-cpu-resident-t$n.err" || status=1
  done
  # The CPU target against this host's run-to-run noise (epoch times differ up to 2x between
  # calls, and between minutes of one call): berth's resident CPU run and PyTorch's, alternated
  # CPU_DUEL_ROUNDS times (default 3); the summary compares each round and the medians.
  if [ "${SKIP_TORCH:-0}" != 1 ] && python3 -c 'import torch' 2>/dev/null; then
    for r in $(seq 1 "${CPU_DUEL_ROUNDS:-3}"); do
      timeout 150 .gpu/berth train --device cpu --epochs 5 --json --resident > "$OUT/duel-berth-$r.json" 2>"$OUT/duel-berth-$r.err" || status=1
      timeout 240 python3 .gpu/shared/bench/torch_train.py data/fashion-mnist --epochs 5 --devices cpu --modes resident > "$OUT/duel-torch-$r.jsonl" 2>"$OUT/duel-torch-$r.err" || status=1
    done
  fi
  # Where a CPU step goes: each op of the step on its shapes, hot (criterion, the default
  # pool of all cores), and the resident run profiled (medians per op in the summary).
  timeout 120 .gpu/bench-cpu-step --bench > "$OUT/loader-cpu-step.txt" 2>&1 || status=1
  timeout 100 .gpu/berth train --device cpu --resident --epochs 1 --profile "$OUT/loader-cpu-profile.json" --profile-warmup 100 --profile-steps 200 > "$OUT/loader-cpu-profile.txt" 2>&1 || status=1
  if [ "${SKIP_TORCH:-0}" != 1 ] && python3 -c 'import torch' 2>/dev/null; then
    timeout 240 python3 .gpu/shared/bench/torch_train.py data/fashion-mnist --epochs 5 > "$OUT/loader-torch-train.jsonl" 2>"$OUT/loader-torch-train.err" || status=1
    # Only the DataLoader part of torch_baseline.py (its last section), with its imports.
    timeout 120 python3 - .gpu/shared/bench/torch_baseline.py > "$OUT/loader-torch-baseline.json" 2>"$OUT/loader-torch-baseline.err" <<'PY' || status=1
import sys
src = open(sys.argv[1]).read()
head, tail = src.split("# allocator latency", 1)[0], src.split("# DataLoader throughput to GPU", 1)[1]
exec(compile(head + tail, sys.argv[1], "exec"))
PY
  fi
  python3 - "$OUT" <<'PY' | tee "$OUT/loader-summary.md"
import collections, json, os, statistics, sys
out = sys.argv[1]
def lines(name):
    p = os.path.join(out, name)
    for l in (open(p) if os.path.exists(p) else []):
        try: yield json.loads(l)
        except ValueError: pass
def obj(name):
    try: return json.load(open(os.path.join(out, name)))
    except Exception: return {}
b = list(lines("loader-bench.jsonl"))
par = {f["memcpy_threads"]: f["gb_per_s"] for f in b if f["target"] == "memcpy" and f.get("memcpy_threads")}
tdl = obj("loader-torch-baseline.json").get("dataloader_3072f32_b256", {})
print("| workers | to cuda:0 samples/s (GB/s) | pinned, left on the host | host samples/s (GB/s) | memcpy same threads GB/s | host / memcpy | PyTorch to GPU |")
print("|---|---|---|---|---|---|---|")
ws = sorted({f["workers"] for f in b if f.get("workers") is not None})
for w in ws:
    g = next((f for f in b if f["target"] == "cuda:0" and f["workers"] == w), None)
    h = next((f for f in b if f["target"] == "host" and f["workers"] == w), None)
    hp = next((f for f in b if f["target"] == "host-pinned" and f["workers"] == w), None)
    t = tdl.get(f"workers{w}_pin{int(w > 0)}_samples_per_s")
    fmt = lambda f: f"{f['samples_per_second']/1e6:.2f}M ({f['gb_per_s']:.1f})" if f else "-"
    print(f"| {w} | {fmt(g)} | {fmt(hp)} | {fmt(h)} | {par.get(max(w,1), float('nan')):.1f} | {h['vs_parallel_memcpy']:.2f} | {f'{t/1e6:.2f}M' if t else '-'} |" if h else f"| {w} | {fmt(g)} | {fmt(hp)} | - | - | - | - |")
print()
print("| run | samples/s | test accuracy | epoch seconds |")
print("|---|---|---|---|")
for dev in ("cpu", "cuda0"):
    for mode in ("loader", "resident"):
        d = obj(f"loader-train-{dev}-{mode}.json")
        if not d:
            print(f"| berth {dev} {mode} | (failed, see .err) | | |")
            continue
        print(f"| berth {dev} {mode} | {d.get('samples_per_second', 0):.0f} | {d.get('test_accuracy', 0)*100:.2f}% | {', '.join(f'{s:.2f}' for s in d.get('epoch_seconds', []))} |")
for n in (4, 8, 16):
    d = obj(f"loader-train-cpu-resident-t{n}.json")
    if d: print(f"| berth cpu resident RAYON_NUM_THREADS={n} | {d.get('samples_per_second', 0):.0f} | {d.get('test_accuracy', 0)*100:.2f}% | {', '.join(f'{s:.2f}' for s in d.get('epoch_seconds', []))} |")
for d in lines("loader-torch-train.jsonl"):
    print(f"| PyTorch {d['device']} {d['mode']} (threads {d.get('threads')}) | {d['samples_per_s_steady']:.0f} | {d['test_accuracy']*100:.2f}% | {', '.join(f'{s:.2f}' for s in d['epoch_seconds'])} |")
# The CPU duel: berth and PyTorch resident on the CPU, alternated round by round.
duel = []
for r in range(1, 100):
    d, t = obj(f"duel-berth-{r}.json"), next(iter(lines(f"duel-torch-{r}.jsonl")), None)
    if not d and t is None:
        break
    duel.append((r, d.get("samples_per_second"), d.get("test_accuracy"), t and t["samples_per_s_steady"], t and t["test_accuracy"]))
if duel:
    print()
    print("| CPU round (resident, 5 epochs) | berth samples/s | berth accuracy | PyTorch samples/s | PyTorch accuracy | berth / PyTorch |")
    print("|---|---|---|---|---|---|")
    for r, b, ba, t, ta in duel:
        ratio = f"{b / t:.2f}" if b and t else "-"
        print(f"| {r} | {b or 0:.0f} | {(ba or 0)*100:.2f}% | {t or 0:.0f} | {(ta or 0)*100:.2f}% | {ratio} |")
    bs, ts = [x[1] for x in duel if x[1]], [x[3] for x in duel if x[3]]
    if bs and ts:
        print(f"| median | {statistics.median(bs):.0f} | | {statistics.median(ts):.0f} | | {statistics.median(bs)/statistics.median(ts):.2f} |")
# The profiled CPU step: median µs per op (by name and input shapes), per step.
prof = obj("loader-cpu-profile.json").get("traceEvents", [])
ops, steps = collections.defaultdict(list), []
for e in prof:
    if e.get("ph") != "X": continue
    if e["name"].startswith("step "): steps.append(e["dur"]); continue
    ops[(e["name"], str(e.get("args", {}).get("input_shapes", "")))].append(e["dur"])
if steps:
    print()
    print(f"CPU step profiled ({len(steps)} steps): median step {statistics.median(steps):.1f} us")
    print("| op | input shapes | median us | calls/step |")
    print("|---|---|---|---|")
    for (n, sh), v in sorted(ops.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {n} | {sh} | {statistics.median(v):.1f} | {len(v)/len(steps):.0f} |")
PY
  grep -E "time:" -B1 "$OUT/loader-cpu-step.txt" | grep -v '^--' | paste - - | sed 's/ \+/ /g' || true
fi
if want live && python3 -c 'import torch' 2>/dev/null; then
  OUT="$OUT" bash scripts/torch-live.sh || status=1
fi
if want torch && [ "${SKIP_TORCH:-0}" != 1 ] && python3 -c 'import torch' 2>/dev/null; then
  timeout 240 python3 .gpu/shared/bench/torch_baseline.py > "$OUT/torch-baseline.json" 2>"$OUT/torch-baseline.err"
fi
# The profiler (issue 16): `berth train --device cuda:0` with the profiler off and on for a few
# steps after the warm-up, alternating twice (the last trace comes back: profile-trace.json), on
# for every step (its trace stays in /tmp: large), and at batch 4096 (profile-trace-b4096.json).
# profile-trace*-overlap.txt is the time the prefetch-stream batch copies overlap the compute
# stream's kernels, per profiled step and in total (scripts/profile-overlap.py);
# profile-summary.json the mean epoch time of each run and the slowdowns (epochs 2 and on:
# epoch 1 compiles the kernels).
if want profile; then
  # Off, the default 5-step profile, every step (CUPTI) and every step with host records only
  # alternate PROFILE_ROUNDS times (3 by default): this host's epochs vary by 10-25% from run to
  # run, so the summary compares medians over the rounds.
  for r in $(seq 1 "${PROFILE_ROUNDS:-3}"); do
    timeout 200 .gpu/berth train --device cuda:0 --epochs 4 --json > "$OUT/profile-off-$r.json" 2>"$OUT/profile-off-$r.err" || status=1
    timeout 200 .gpu/berth train --device cuda:0 --epochs 4 --json --profile "$OUT/profile-trace.json" > "$OUT/profile-steps-$r.json" 2>"$OUT/profile-steps-$r.err" || status=1
    # The same with CUPTI left attached after the profile (no cuptiFinalize): what the
    # teardown of Note [Activity tracing] saves in the epochs after the profiled steps.
    BERTH_CUPTI_TEARDOWN=0 timeout 200 .gpu/berth train --device cuda:0 --epochs 4 --json --profile /tmp/berth-profile-keep.json > "$OUT/profile-steps-keep-$r.json" 2>"$OUT/profile-steps-keep-$r.err" || status=1
    # The default 5 steps, but in epoch 2 (after 940 of the 938 steps an epoch has at batch 64),
    # so that epoch 2's time, profiler start, stop and trace writing included, compares with
    # epoch 2 of the off run: the "profiler-on epoch".
    timeout 200 .gpu/berth train --device cuda:0 --epochs 4 --json --profile /tmp/berth-profile-e2.json --profile-warmup 940 > "$OUT/profile-steps-e2-$r.json" 2>"$OUT/profile-steps-e2-$r.err" || status=1
    timeout 300 .gpu/berth train --device cuda:0 --epochs 4 --json --profile /tmp/berth-profile-all.json --profile-warmup 0 --profile-steps 0 > "$OUT/profile-all-$r.json" 2>"$OUT/profile-all-$r.err" || status=1
    timeout 300 .gpu/berth train --device cuda:0 --epochs 4 --json --profile /tmp/berth-profile-all-cpu.json --profile-activities cpu --profile-warmup 0 --profile-steps 0 > "$OUT/profile-all-cpu-$r.json" 2>"$OUT/profile-all-cpu-$r.err" || status=1
  done
  # PyTorch's side: torch.profiler over the same loop (off, 5 steps after 20, every step with
  # CPU and CUDA activities, every step CPU only), alternated PROFILE_ROUNDS times in one process.
  [ "${PROFILE_TORCH:-1}" = 0 ] || timeout 400 python3 scripts/torch_profile_cost.py .gpu/shared/bench data/fashion-mnist --rounds "${PROFILE_ROUNDS:-3}" > "$OUT/profile-torch.jsonl" 2>"$OUT/profile-torch.err" || status=1
  tail -1 "$OUT/profile-torch.jsonl" 2>/dev/null
  # Every step timed with CUDA events instead of CUPTI (the default where CUPTI loads);
  # PROFILE_QUICK=1 skips it and the batch-4096 run.
  [ "${PROFILE_QUICK:-0}" = 1 ] || timeout 300 .gpu/berth train --device cuda:0 --epochs 4 --json --profile /tmp/berth-profile-all-events.json --profile-device-timer events --profile-warmup 0 --profile-steps 0 > "$OUT/profile-all-events-1.json" 2>"$OUT/profile-all-events-1.err" || status=1
  # Batch 4096: kernels long enough that the host runs ahead of the GPU, so the prefetch copy
  # of batch n+1 is queued while step n's kernels run (at batch 64 the loop is host-bound and
  # each copy runs in a gap between kernels).
  [ "${PROFILE_QUICK:-0}" = 1 ] || timeout 200 .gpu/berth train --device cuda:0 --epochs 2 --batch-size 4096 --json --profile "$OUT/profile-trace-b4096.json" --profile-warmup 5 --profile-steps 5 > "$OUT/profile-b4096.json" 2>"$OUT/profile-b4096.err" || status=1
  ls -l "$OUT"/profile-trace*.json /tmp/berth-profile-all.json 2>&1 | tee "$OUT/profile-files.txt"
  for t in profile-trace profile-trace-b4096; do
    timeout 60 python3 scripts/profile-overlap.py "$OUT/$t.json" > "$OUT/$t-overlap.txt" 2>&1 || status=1
    cat "$OUT/$t-overlap.txt"
  done
  python3 - "$OUT" <<'PY' | tee "$OUT/profile-summary.json"
import json, os, sys
out = sys.argv[1]
import glob, statistics
tags = ("off", "steps", "steps-e2", "steps-keep", "all", "all-cpu", "all-events", "b4096")
report = {}
# epochs 2 and on (epoch 1 compiles the kernels), every epoch (the whole run, the profiled
# steps of epoch 1 included), and epoch 2 alone (where steps-e2 profiles).
def epochs(tag, span):
    try:
        v = json.load(open(os.path.join(out, f"profile-{tag}.json")))["epoch_seconds"]
    except Exception as e:
        return str(e)
    v = v[span[0]:span[1]]
    return sum(v) / len(v)
for key, span in (("epochs_2_on", (1, None)), ("all_epochs", (0, None)), ("epoch_2", (1, 2))):
    runs = {}
    for t in tags:
        files = sorted(glob.glob(os.path.join(out, f"profile-{t}-[0-9]*.json"))) or [os.path.join(out, f"profile-{t}.json")]
        runs[t] = [epochs(os.path.basename(f)[len("profile-"):-len(".json")], span) for f in files]
    med = {t: statistics.median(v) for t, v in runs.items() if v and all(isinstance(x, float) for x in v)}
    vs_off = {t: med[t] / med["off"] - 1 for t in med if "off" in med and t not in ("off", "b4096")}
    report[key] = {"mean_s_per_round": runs, "median_s": med, "slowdown_vs_off_median": vs_off}
print(json.dumps(report))
PY
fi
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
berth = {}
for l in open(os.path.join(out, "berth-bench.jsonl")):
    try: f = json.loads(l); berth[f["figure"]] = (f["value"], f["unit"])
    except Exception: pass
torch = {}
try: torch = json.load(open(os.path.join(out, "torch-baseline.json")))
except Exception: pass
tr = torch.get("transfers", {})
pairs = [
  ("h2d pageable 256 MiB (GB/s)", tr.get("h2d_pageable_GBps")),
  ("h2d pinned 256 MiB (GB/s)", tr.get("h2d_pinned_GBps")),
  ("d2h pageable 256 MiB (GB/s)", tr.get("d2h_pageable_GBps")),
  ("d2h pinned 256 MiB (GB/s)", tr.get("d2h_pinned_GBps")),
  ("d2d copy 4 GiB, bytes read + written (GB/s)", tr.get("d2d_GBps_read+write")),
  ("pin_memory() 256 MiB first (ms)", tr.get("pin_memory_256MiB_first_ms")),
  ("pin_memory() 256 MiB again (ms)", tr.get("pin_memory_256MiB_again_ms")),
]
lines = ["| figure | berth | PyTorch (same run) |", "|---|---|---|"]
seen = set()
for name, t in pairs:
    b = berth.get(name); seen.add(name)
    lines.append(f"| {name} | {b[0]:.2f} | {t if t is None else round(t, 2)} |" if b else f"| {name} | - | {t} |")
for name, (v, u) in berth.items():
    if name not in seen:
        lines.append(f"| {name} | {v:.3f} {u} | see torch-baseline.json |")
table = "\n".join(lines)
open(os.path.join(out, "table.md"), "w").write(table + "\n")
print(table)
PY
cat "$OUT/tests-summary.txt" 2>/dev/null
exit $status
EOF
sed -i "s|^BUILT_AT=__BUILT_AT__|BUILT_AT=$PWD|" .gpu/run.sh
chmod +x .gpu/run.sh
du -sh .gpu >&2
echo
echo "Run on the GPU machine (run tool, carry [\".gpu\"]):"
echo "  bash .gpu/run.sh                      (everything; over 10 minutes on one call, so split:)"
echo "  PARTS='tests alloc seeds' bash .gpu/run.sh;  PARTS='bench train replay' bash .gpu/run.sh;  PARTS=torch bash .gpu/run.sh"
echo "  PARTS=profile bash .gpu/run.sh        (the profiler: train with and without --profile, copy/compute overlap)"
echo "  PARTS=loader bash .gpu/run.sh         (issue 15: DataLoader sweep + berth train cpu/cuda beside PyTorch, one table)"
