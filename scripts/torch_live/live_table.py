"""Turns torch_live.py's and live_programs.py's JSON lines (several allocators per workload,
same call, optionally several rounds: torch-live.sh ROUNDS) into one markdown table with the
checks: values against the default's, step time against the default's, and the driver's peak
(cuMemGetInfo used bytes over the run, minus the process's baseline) of berth:paged against
expandable segments'.
usage: live_table.py live.jsonl

`first ms` is the first step's time (the cold allocator's calls fall there), `driver peak` the
process's peak device memory as the driver saw it, sampled after every step (the CUDA context
excluded), `reserved` the allocator's own peak, and `driver − reserved` the difference of the
two peaks (memory outside the allocator: cuBLAS and cuDNN workspaces, other libraries).
Lines without memory figures (live_programs.py's LIVE_SMOKE=cpu) are skipped.

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
        if r.get("driver_peak_used_bytes") is None or r.get("peak_reserved") is None:
            continue
        runs[r["workload"]][r["allocator"]][r.get("round", 0)] = r

rounds = max((len(by_r) for by in runs.values() for by_r in by.values()), default=0)
print(f"Rounds: {rounds}.\n")
print("| workload | allocator | values = default | first ms | median step ms | × default | driver peak | reserved | driver − reserved | device allocs |")
print("|---|---|---|---|---|---|---|---|---|---|")
verdicts = []
wins = []  # (workload, paged's driver peak <= expandable's, paged / expandable - 1)
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
        first = r0.get("first_step_ms", r0["step_ms"][0] if r0.get("step_ms") else float("nan"))
        print(f'| {w} | {a} | {same} | {first:.1f} | {med:.2f} | {shown} | {r0["driver_peak_used_bytes"]:,} | '
              f'{r0["peak_reserved"]:,} | {r0["driver_peak_used_bytes"] - r0["peak_reserved"]:,} | '
              f'{r0["num_device_alloc"]} |')
        for k, r in by_r.items():
            if (r["peak_reserved"], r["num_device_alloc"]) != (r0["peak_reserved"], r0["num_device_alloc"]):
                verdicts.append(f"{w}: {a} round {k} reserved {r['peak_reserved']:,} / "
                                f"{r['num_device_alloc']} device allocs, round {min(by_r)} "
                                f"{r0['peak_reserved']:,} / {r0['num_device_alloc']}")
    e, p, t = (by.get(n) for n in ("expandable", "berth:paged", "berth:pytorch"))
    e, p, t = (x[min(x)] if x else None for x in (e, p, t))
    tol = 0.01
    if d0 and t:
        verdicts.append(f"{w}: berth:pytorch reserved {'==' if t['peak_reserved'] == d0['peak_reserved'] else '!='} default "
                        f"({t['peak_reserved']:,} vs {d0['peak_reserved']:,}), device allocs {t['num_device_alloc']} vs {d0['num_device_alloc']}")
    if e and p:
        wins.append((w, p["driver_peak_used_bytes"] <= e["driver_peak_used_bytes"],
                     p["driver_peak_used_bytes"] / max(e["driver_peak_used_bytes"], 1) - 1))
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
if wins:
    lost = [f"{w} (+{d:.2%})" for w, ok, d in wins if not ok]
    print(f"berth:paged's driver peak <= expandable segments' on {sum(ok for _, ok, _ in wins)} of "
          f"{len(wins)} programs" + (f"; over on {', '.join(lost)}" if lost else "") + ".\n")
for v in verdicts:
    print("- " + v)
