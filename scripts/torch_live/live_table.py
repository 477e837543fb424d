"""Turns torch_live.py's JSON lines (several allocators per workload, same call) into one
markdown table with the issue's checks. usage: live_table.py live.jsonl"""
import json, sys
from collections import defaultdict

rows = defaultdict(dict)


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
        rows[r["workload"]][r["allocator"]] = r

print("| workload | allocator | values = default | median step ms | × default | peak reserved | device allocs | driver peak used |")
print("|---|---|---|---|---|---|---|---|")
verdicts = []
for w, by in rows.items():
    d = by.get("default")
    for a, r in by.items():
        same = "—" if a == "default" or not d else values_vs(r["values"], d["values"])
        ratio = f'{r["median_step_ms"] / d["median_step_ms"]:.3f}' if d else "—"
        print(f'| {w} | {a} | {same} | {r["median_step_ms"]:.2f} | {ratio} | {r["peak_reserved"]:,} | '
              f'{r["num_device_alloc"]} | {r["driver_peak_used_bytes"]:,} |')
    e, p, t = by.get("expandable"), by.get("berth:paged"), by.get("berth:pytorch")
    tol = 0.05 if w in ("two_stream_pipeline", "gpt2_generate") else 0.02
    if d and t:
        verdicts.append(f"{w}: berth:pytorch reserved {'==' if t['peak_reserved'] == d['peak_reserved'] else '!='} default "
                        f"({t['peak_reserved']:,} vs {d['peak_reserved']:,}), device allocs {t['num_device_alloc']} vs {d['num_device_alloc']}")
    if e and p:
        verdicts.append(f"{w}: berth:paged reserved {'<=' if p['peak_reserved'] <= e['peak_reserved'] else '>'} expandable "
                        f"({p['peak_reserved']:,} vs {e['peak_reserved']:,}); driver peak "
                        f"{'<=' if p['driver_peak_used_bytes'] <= e['driver_peak_used_bytes'] else '>'} "
                        f"({p['driver_peak_used_bytes']:,} vs {e['driver_peak_used_bytes']:,})")
    for name in ("berth:paged", "berth:pytorch", "berth:trivial"):
        if d and name in by:
            ratio = by[name]["median_step_ms"] / d["median_step_ms"]
            verdicts.append(f"{w}: {name} median step {ratio:.3f}× default "
                            f"({'within' if abs(ratio - 1) <= tol else 'outside'} {tol:.0%})")
print()
for v in verdicts:
    print("- " + v)
