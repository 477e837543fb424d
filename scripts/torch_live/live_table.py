"""Turns torch_live.py's JSON lines (several allocators per workload, same call, optionally
several rounds: torch-live.sh ROUNDS) into one markdown table with the issue's checks.
usage: live_table.py live.jsonl

With several rounds, `median step ms` is the median over rounds of each process's median step,
and `× default` is the median over rounds of (this allocator's median step ÷ the default's in
the same round); values, peaks and counts are the first round's, and any round that differs
from the first in them is reported."""
import json, statistics, sys
from collections import defaultdict

runs = defaultdict(lambda: defaultdict(dict))  # workload -> allocator -> round -> record


def values_vs(v, ref):
    """'yes' when identical; else how far apart (losses: max |difference|, steps differing)."""
    if v == ref:
        return "yes"
    try:
        diff = [abs(x - y) for x, y in zip(v, ref)]
        return f"max Δ {max(diff):.1e} ({sum(d > 0 for d in diff)} of {len(diff)} steps)"
    except TypeError:  # checksums
        return "**no**"


for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        runs[r["workload"]][r["allocator"]][r.get("round", 0)] = r

rounds = max((len(by_r) for by in runs.values() for by_r in by.values()), default=0)
print(f"Rounds: {rounds}.\n")
print("| workload | allocator | values = default | median step ms | × default | peak reserved | device allocs | driver peak used |")
print("|---|---|---|---|---|---|---|---|")
verdicts = []
for w, by in runs.items():
    d = by.get("default", {})
    d0 = d[min(d)] if d else None
    ratio_of = {}
    for a, by_r in by.items():
        r0 = by_r[min(by_r)]
        same = "—" if a == "default" or not d0 else values_vs(r0["values"], d0["values"])
        med = statistics.median(r["median_step_ms"] for r in by_r.values())
        ratios = [r["median_step_ms"] / d[k]["median_step_ms"] for k, r in by_r.items() if k in d]
        ratio = statistics.median(ratios) if ratios else None
        ratio_of[a] = (ratio, ratios)
        shown = "—" if ratio is None else f"{ratio:.3f}"
        print(f'| {w} | {a} | {same} | {med:.2f} | {shown} | {r0["peak_reserved"]:,} | '
              f'{r0["num_device_alloc"]} | {r0["driver_peak_used_bytes"]:,} |')
        for k, r in by_r.items():
            if (r["peak_reserved"], r["num_device_alloc"]) != (r0["peak_reserved"], r0["num_device_alloc"]):
                verdicts.append(f"{w}: {a} round {k} reserved {r['peak_reserved']:,} / "
                                f"{r['num_device_alloc']} device allocs, round {min(by_r)} "
                                f"{r0['peak_reserved']:,} / {r0['num_device_alloc']}")
    e, p, t = (by.get(n) for n in ("expandable", "berth:paged", "berth:pytorch"))
    e, p, t = (x[min(x)] if x else None for x in (e, p, t))
    tol = 0.05 if w in ("two_stream_pipeline", "gpt2_generate") else 0.02
    if d0 and t:
        verdicts.append(f"{w}: berth:pytorch reserved {'==' if t['peak_reserved'] == d0['peak_reserved'] else '!='} default "
                        f"({t['peak_reserved']:,} vs {d0['peak_reserved']:,}), device allocs {t['num_device_alloc']} vs {d0['num_device_alloc']}")
    if e and p:
        verdicts.append(f"{w}: berth:paged reserved {'<=' if p['peak_reserved'] <= e['peak_reserved'] else '>'} expandable "
                        f"({p['peak_reserved']:,} vs {e['peak_reserved']:,}); driver peak "
                        f"{'<=' if p['driver_peak_used_bytes'] <= e['driver_peak_used_bytes'] else '>'} "
                        f"({p['driver_peak_used_bytes']:,} vs {e['driver_peak_used_bytes']:,})")
    for name in ("expandable", "berth:paged", "berth:pytorch", "berth:trivial"):
        ratio, ratios = ratio_of.get(name, (None, []))
        if ratio is not None:
            each = "" if len(ratios) < 2 else " (rounds: " + ", ".join(f"{x:.3f}" for x in ratios) + ")"
            verdicts.append(f"{w}: {name} median step {ratio:.3f}× default "
                            f"({'within' if abs(ratio - 1) <= tol else 'outside'} {tol:.0%}){each}")
print()
for v in verdicts:
    print("- " + v)
