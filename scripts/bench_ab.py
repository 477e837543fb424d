#!/usr/bin/env python3
"""Two `berth` binaries (before and after a change) on the same machine, interleaved.

Usage: scripts/bench_ab.py BEFORE AFTER [--rounds N] [--out DIR] [--torch SCRIPT]
                            [--only transfers,loader,replay] [--traces GLOB --torch-replay SCRIPT]

Each round runs `berth bench transfers --json` and `berth bench dataloader --json --workers
0,4,8,16 --epochs 9` with both binaries, in ABBA order (before, after, after, before, ...) so
that a drift of the machine over the call falls on both. Every figure is then the median over
the rounds of each binary; the noise of a figure is the spread of its before runs and of its
after runs (max / min within one binary); a change is within noise when the after / before
ratio of the medians lies inside that spread. With --torch, PyTorch's baseline script
(`torch_baseline.py`) runs once in the same call, so each loader figure also has its ratio to
PyTorch's DataLoader. With --traces, each round also replays the traces with
`berth replay --device cuda:0 --policy all --json` (warm ns/op and peak reserved per trace and
policy), and --torch-replay (PyTorch's `torch_replay.py`) replays them through PyTorch's own
allocator once per round, so each replay figure has its ratio to PyTorch's in the same call.

Writes DIR/ab.jsonl (every raw line, tagged with binary and round) and prints a Markdown table.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

LOADER = ["bench", "dataloader", "--json", "--workers", "0,4,8,16", "--epochs", "9"]
TRANSFERS = ["bench", "transfers", "--json"]


def figures(binary, args):
    """The JSON lines of one `berth` run, keyed by figure name."""
    out = subprocess.run([binary] + args, check=True, capture_output=True, text=True).stdout
    got = {}
    for line in out.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("bench") == "transfers" and "figure" in j:
            got[j["figure"]] = j["value"]
        elif j.get("bench") == "dataloader" and j.get("target") not in (None, "memcpy"):
            got[f"loader {j['target']}, {j['workers']} workers (M samples/s)"] = (
                j["samples_per_second"] / 1e6)
        elif j.get("bench") == "dataloader" and j.get("target") == "memcpy":
            got[f"memcpy {j.get('memcpy_threads')} threads (GB/s)"] = j["gb_per_s"]
        elif "trace" in j and "policy" in j and "ns_per_op" in j:
            got[f"replay {j['trace']} {j['policy']} warm ns/op"] = j["ns_per_op"]
            got[f"replay {j['trace']} {j['policy']} peak reserved (bytes)"] = j["peak_reserved"]
    return got


def torch_replay(script, traces):
    """PyTorch's own allocator on the traces: warm ns/op by trace."""
    p = subprocess.run([sys.executable, script] + traces, capture_output=True, text=True)
    got = {}
    for line in p.stdout.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        got[j["trace"]] = j["ns_per_op_warm"]
    if not got:
        print(f"PyTorch's replay gave nothing: {p.stderr[-2000:]}", file=sys.stderr)
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--torch", help="PyTorch's torch_baseline.py, run once in this call")
    ap.add_argument("--only", default="transfers,loader",
                    help="comma-separated parts: transfers, loader, replay")
    ap.add_argument("--traces", help="a glob of .trace.json.gz files for the replay part")
    ap.add_argument("--torch-replay", help="PyTorch's torch_replay.py, once per round")
    ap.add_argument("--replay-device", default="cuda:0",
                    help="berth replay's --device ('' for the simulated device)")
    a = ap.parse_args()
    parts = set(a.only.split(","))
    traces = sorted(glob.glob(a.traces)) if a.traces else []
    if "replay" in parts and not traces:
        ap.error("--only replay needs --traces GLOB matching at least one trace")
    runs = {"before": [], "after": []}
    torch_ns = []
    with open(os.path.join(a.out, "ab.jsonl"), "w") as log:
        for r in range(a.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for which in order:
                binary = getattr(a, which)
                f = {}
                if "transfers" in parts:
                    f.update(figures(binary, TRANSFERS))
                if "loader" in parts:
                    f.update(figures(binary, LOADER))
                if "replay" in parts:
                    dev = ["--device", a.replay_device] if a.replay_device else []
                    f.update(figures(binary, ["replay"] + dev + ["--policy", "all", "--json"]
                                     + traces))
                runs[which].append(f)
                log.write(json.dumps(dict(binary=which, round=r, figures=f)) + "\n")
                log.flush()
                print(f"round {r} {which} done", file=sys.stderr)
            if "replay" in parts and a.torch_replay:
                t = torch_replay(a.torch_replay, traces)
                torch_ns.append(t)
                log.write(json.dumps(dict(binary="pytorch-replay", round=r, figures=t)) + "\n")
                log.flush()
        torch_loader = {}
        if a.torch and "loader" in parts:
            p = subprocess.run([sys.executable, a.torch], capture_output=True, text=True)
            log.write(json.dumps(dict(binary="pytorch", stdout=p.stdout[-20000:])) + "\n")
            # The script prints one indented JSON object at its end.
            try:
                j = json.loads(p.stdout[p.stdout.index("{"):])
                torch_loader = j.get("dataloader_3072f32_b256", {})
            except ValueError:
                print(f"PyTorch's baseline gave no JSON: {p.stderr[-2000:]}", file=sys.stderr)
    names = [n for n in runs["before"][0] if all(n in r for r in runs["before"] + runs["after"])]
    print(f"| figure | before: median (min–max) of {a.rounds} | after: median (min–max) | "
          "after ÷ before | within noise |")
    print("|---|---|---|---|---|")
    held = 0
    for n in names:
        b = [r[n] for r in runs["before"]]
        f = [r[n] for r in runs["after"]]
        mb, mf = statistics.median(b), statistics.median(f)
        ratio = mf / mb if mb else float("nan")
        # The noise band: how far one binary's own runs lie from its median.
        lo = min(min(b) / mb, min(f) / mf)
        hi = max(max(b) / mb, max(f) / mf)
        ok = lo <= ratio <= hi
        held += ok
        print(f"| {n} | {mb:.3g} ({min(b):.3g}–{max(b):.3g}) | {mf:.3g} ({min(f):.3g}–{max(f):.3g}) "
              f"| {ratio:.3f} | {'yes' if ok else 'NO'} ({lo:.2f}–{hi:.2f}) |")
    print(f"\n{held} of {len(names)} figures within noise.")
    if torch_loader:
        print("\n| workers | PyTorch to GPU (M samples/s) | berth before ÷ PyTorch | berth after ÷ PyTorch |")
        print("|---|---|---|---|")
        for key, t in torch_loader.items():
            w = int(key.split("workers")[1].split("_")[0])
            n = f"loader cuda:0, {w} workers (M samples/s)"
            if n not in names:
                continue
            mb = statistics.median(r[n] for r in runs["before"])
            mf = statistics.median(r[n] for r in runs["after"])
            print(f"| {w} | {t / 1e6:.3f} | {mb / (t / 1e6):.1f}× | {mf / (t / 1e6):.1f}× |")


    if torch_ns:
        print("\n| trace | policy | PyTorch default warm ns/op (median) | berth before ÷ PyTorch "
              "| berth after ÷ PyTorch |")
        print("|---|---|---|---|---|")
        for trace in sorted(torch_ns[0]):
            t = statistics.median(r[trace] for r in torch_ns if trace in r)
            for policy in ("pytorch", "expandable", "paged"):
                n = f"replay {trace} {policy} warm ns/op"
                if n not in names:
                    continue
                mb = statistics.median(r[n] for r in runs["before"])
                mf = statistics.median(r[n] for r in runs["after"])
                print(f"| {trace} | {policy} | {t:.1f} | {mb / t:.2f} | {mf / t:.2f} |")


if __name__ == "__main__":
    main()
