"""The table of the recorded traces: PyTorch's live figures in its three modes (from
record-traces.sh's figures.jsonl) beside berth's replays (`berth replay --json` lines: `--policy
all`, and `--policy pytorch --real-addrs`, whose lines this script tells apart by their
device_allocs matching the live default's).

usage: trace_table.py FIGURES.jsonl REPLAY.jsonl TRACE_DIR
Prints markdown: one row per trace, then paged's geometric-mean waste (the geometric mean of
peak reserved ÷ peak requested − 1) and the traces where paged reserves more than the smallest PyTorch mode."""
import gzip, json, math, sys
from collections import defaultdict

figs = defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    mode = {"": "default", "expandable_segments:True": "expandable",
            "backend:cudaMallocAsync": "async"}[r["alloc_conf"]]
    figs[r["workload"]][mode] = r
replays = defaultdict(list)
for line in open(sys.argv[2]):
    if line.startswith("{"):
        r = json.loads(line)
        replays[r["trace"]].append(r)


def shape(name):
    with gzip.open(f"{sys.argv[3]}/{name}.trace.json.gz", "rt") as f:
        t = json.load(f)
    ev = t["events"]
    return sum(1 for e in ev if e[0] == "alloc"), len({e[3] for e in ev if e[0] == "alloc"})


print("| trace | allocations | streams | peak requested | PyTorch default: reserved / segments | expandable: reserved / segments | cudaMallocAsync: reserved | berth `pytorch` (recorded addresses) | berth `paged`: reserved (÷ requested) / device calls | paged ≤ smallest mode |")
print("|---|---|---|---|---|---|---|---|---|---|")
wastes, losses = [], []
for name in sorted(figs):
    f = figs[name]
    d, e, a = (f.get(m, {}).get("stats", {}) for m in ("default", "expandable", "async"))
    rs = replays.get(name, [])
    paged = next((r for r in rs if r["policy"] == "paged"), None)
    exact = [r for r in rs if r["policy"] == "pytorch" and r["peak_reserved"] == d.get("max_memory_reserved")
             and r["device_allocs"] == d.get("num_device_alloc")]
    allocs, streams = shape(name)
    req = paged["peak_requested"] if paged else d.get("requested_bytes.all.peak")
    modes = [x.get("max_memory_reserved") for x in (d, e, a) if x.get("max_memory_reserved")]
    best = min(modes)
    pr = paged["peak_reserved"] if paged else None
    ok = pr is not None and pr <= best
    if pr:
        wastes.append(pr / req - 1)
        if not ok:
            losses.append(f"{name}: paged {pr:,} > {best:,} ({pr / best - 1:+.2%})")
    print(f"| {name} | {allocs} | {streams} | {req:,} | {d.get('max_memory_reserved', 0):,} / {d.get('num_device_alloc')} | "
          f"{e.get('max_memory_reserved', 0):,} / {e.get('num_device_alloc')} | {a.get('max_memory_reserved', 0):,} | "
          f"{'exact' if exact else '**differs**'} | {pr:,} ({pr / req:.4f}) / {paged['device_calls']} | {'yes' if ok else '**no**'} |")
if wastes:
    # The measure: the geometric mean of the waste (peak reserved ÷ peak requested − 1).
    g = math.exp(sum(math.log(w) for w in wastes) / len(wastes))
    print(f"\npaged geometric-mean waste over these {len(wastes)} traces: {g:.2%}")
for l in losses:
    print("- " + l)
