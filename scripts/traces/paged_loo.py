"""Leave-one-out check of paged's constants over every committed trace.

usage: paged_loo.py SWEEP.jsonl [FIGURES.jsonl]
  SWEEP.jsonl    `cargo run --release -p berth-alloc --example paged_sweep` output
  FIGURES.jsonl  PyTorch's live figures of the recorded traces
                 (default crates/berth-alloc/tests/data/pytorch_figures_2026-12-01.jsonl)

A configuration's score on a set of traces (lower is better): the geometric mean of the waste
(peak reserved ÷ peak requested − 1), with every target it misses on a trace counted as a
penalty. The targets (`Note [Paged best fit]`, "Time, not calls"): P, first-pass peak reserved
at or under the smallest of PyTorch's three modes; F, the same after three passes; T, the device
calls of a warm pass costing at most 1% of the recorded program's time (first to last event);
C, the first pass's calls costing at most 1% of that time more than PyTorch's `cudaMalloc`s. A
first-pass call (a map) is taken to cost CALL_US, a warm-pass call WARM_CALL_US (an unmap waits
for its stream), a `cudaMalloc` CUDA_MALLOC_US: `berth replay --device cuda:0` on the H200
(2026-12-03) gave about 45 µs a map in first passes, about 100 µs a call in warm passes and
about 62 µs a `cudaMalloc` (cold minus warm time over the calls made). For each trace, the constants are chosen on
the other traces and scored on the one left out; the table shows what was chosen and how the
left-out trace fared. Then the configuration chosen on all traces and the default constants on
the whole set, and the frontier: for each number of traces that miss a target, the lowest
geometric-mean waste any configuration reaches with no more misses."""
import glob, gzip, json, math, os, sys
from collections import defaultdict

# The first five traces: PyTorch's default live figures, and its expandable / cudaMallocAsync
# peaks from its C++ replay (BENCHMARKS.md, tests/paged.rs).
FIRST = {
    "bert_varlen_train": (18_184_404_992, 181, 16_227_762_176, 16_240_345_088),
    "gpt2_generate": (759_169_024, 31, 738_197_504, 838_860_800),
    "gpt2_train": (10_204_741_632, 191, 9_235_857_408, 12_180_258_816),
    "resnet50_train": (7_031_750_656, 111, 5_991_563_264, 6_140_461_056),
    "two_stream_pipeline": (354_418_688, 12, 341_835_776, 369_098_752),
}
PENALTY = 10.0  # each missed target multiplies the score tenfold: targets first, then waste

ref = dict(FIRST)
figs = sys.argv[2] if len(sys.argv) > 2 else "crates/berth-alloc/tests/data/pytorch_figures_2026-12-01.jsonl"
modes = defaultdict(dict)
for line in open(figs):
    r = json.loads(line)
    modes[r["workload"]][r["alloc_conf"]] = r["stats"]
for w, m in modes.items():
    d, e, a = m[""], m["expandable_segments:True"], m["backend:cudaMallocAsync"]
    ref[w] = (d["max_memory_reserved"], d["num_device_alloc"], e["max_memory_reserved"], a["max_memory_reserved"])

runs = defaultdict(dict)  # config -> trace -> record
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["headroom_div"], r["calls_per_20mib"], r.get("unit_mib", 64), r.get("churn_div", 0), r.get("run_units", 0))][r["trace"]] = r

CALL_US, WARM_CALL_US, CUDA_MALLOC_US = 45.0, 100.0, 62.0
# Each recorded program's time for one pass, first to last event, in microseconds.
span_us = {}
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../crates/berth-alloc/tests/data")
for path in glob.glob(os.path.join(DATA, "*.trace.json.gz")):
    times = [e[4] for e in json.load(gzip.open(path))["events"]]
    span_us[os.path.basename(path)[: -len(".trace.json.gz")]] = max(times) - min(times)


def missed(trace, r):
    """The targets a replay misses, one letter each (see the docstring)."""
    default, segments, expandable, asynch = ref[trace]
    smallest, span = min(default, expandable, asynch), span_us[trace]
    warm_us = r.get("warm_calls", 0) / 2 * WARM_CALL_US
    extra_first_us = r["device_calls"] * CALL_US - segments * CUDA_MALLOC_US
    return (("P" if r["peak_reserved"] > smallest else "")
            + ("F" if r.get("final_peak", 0) > smallest else "")
            + ("T" if warm_us > span / 100 else "")
            + ("C" if extra_first_us > span / 100 else ""))


def judge(trace, r):
    """The waste (peak reserved ÷ peak requested − 1) and the number of targets missed."""
    return r["peak_reserved"] / r["peak_requested"] - 1, len(missed(trace, r))


def score(config, traces):
    logs = []
    for t in traces:
        w, m = judge(t, runs[config][t])
        logs.append(math.log(max(w, 1e-6)) + (m > 0) * math.log(PENALTY))
    return math.exp(sum(logs) / len(logs))


traces = sorted(t for t in ref if all(t in v for v in runs.values()))
configs = sorted(runs)
print(f"{len(traces)} traces, {len(configs)} configurations (headroom_div × calls_per_20mib × unit MiB × churn_div × run_units).\n")
print("| left out | chosen on the others (headroom_div, calls per 20 MiB, unit MiB, churn_div, run_units) | left-out waste | left-out misses |")
print("|---|---|---|---|")
for t in traces:
    rest = [x for x in traces if x != t]
    best = min(configs, key=lambda c: score(c, rest))
    w, _ = judge(t, runs[best][t])
    print(f"| {t} | {', '.join(map(str, best))} | {w:.2%} | {missed(t, runs[best][t]) or '—'} |")


def summary(c, label):
    ws, fws, miss = [], [], []
    for t in traces:
        r = runs[c][t]
        ws.append(r["peak_reserved"] / r["peak_requested"] - 1)
        fws.append(r.get("final_peak", r["peak_reserved"]) / r["peak_requested"] - 1)
        if missed(t, r):
            miss.append(f"{t} {missed(t, r)}")
    g = lambda xs: math.exp(sum(math.log(max(w, 1e-6)) for w in xs) / len(xs))
    print(f"- {label} {c}: geometric-mean waste {g(ws):.2%} (after three passes {g(fws):.2%}); "
          f"targets missed on {len(miss)} traces {miss}")


print()
summary(min(configs, key=lambda c: score(c, traces)), "chosen on all traces")
for c, label in (((16, float("inf"), 32, 0, 0), "today's constants"),
                 ((8, 2, 64, 4, 2), "the constants before 2026-12-03")):
    match = [k for k in runs if k[0] == c[0] and k[2:] == c[2:] and (k[1] == c[1] or k[1] >= 1e6 and c[1] == float("inf"))]
    if match:
        summary(match[0], label)

print("\nFrontier: for each number of traces missing a target, the lowest geometric-mean waste")
print("\n| traces missing | geometric-mean waste | configuration | misses (P peak, F after three passes, T warm time, C first-pass time) |")
print("|---|---|---|---|")
best = {}
for c in configs:
    logs, miss = [], []
    for t in traces:
        w, _ = judge(t, runs[c][t])
        logs.append(math.log(max(w, 1e-6)))
        if missed(t, runs[c][t]):
            miss.append(f"{t} {missed(t, runs[c][t])}")
    g = math.exp(sum(logs) / len(logs))
    if len(miss) not in best or g < best[len(miss)][0]:
        best[len(miss)] = (g, c, miss)
lowest = float("inf")
for n in sorted(best):
    g, c, miss = best[n]
    if g < lowest:  # a row only where more misses buy a lower waste
        lowest = g
        print(f"| {n} | {g:.3%} | {', '.join(map(str, c))} | {'; '.join(miss) or '—'} |")
