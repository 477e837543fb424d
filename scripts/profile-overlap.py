#!/usr/bin/env python3
"""How much of the batch copies overlap compute, from a Chrome trace of `berth train --profile`.

Usage: scripts/profile-overlap.py TRACE.json [--json]

Reads the trace that berth::profiler writes (stdlib only): device spans of ops (cat "kernel")
and copies (cat "gpu_memcpy") on their stream tracks (pid 1 + device index, one tid per
stream), host ops (cat "cpu_op") and the `record_function("step N")` ranges of `berth train`
(cat "user_annotation"). Per device, the compute stream is the stream with the most kernel
time; a prefetch stream is any other stream that ran host-to-device copies.

For every step N it prints the time the prefetch-stream copies overlap step N's kernels on the
compute stream (step N's kernels: the device spans of the host ops run inside the "step N"
range), which copies those were (by their index among the prefetch copies), and how long step
N's kernels ran; per copy, the step its host call came before and the steps whose kernels it
overlapped; then the totals: prefetch copy time, the part of it that overlapped any
compute kernel, and the share. With --json the last line is one JSON object with the same
figures. A CPU trace has no stream tracks: the script says so and exits 0.
"""
import json
import re
import sys
from collections import defaultdict


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    as_json = "--json" in argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(args[0]) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    streams = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid", 0) >= 1
    }
    host_ops = [e for e in events if e.get("cat") == "cpu_op"]
    if not streams:
        threads = {e["tid"] for e in host_ops}
        msg = (f"no stream tracks in {args[0]}: a CPU trace ({len(host_ops)} host ops on "
               f"{len(threads)} thread(s)); no copy/compute overlap to measure")
        print(msg)
        if as_json:
            print(json.dumps({"trace": args[0], "stream_tracks": 0, "host_ops": len(host_ops)}))
        return 0

    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    kernel_time = defaultdict(float)
    for k in kernels:
        kernel_time[(k["pid"], k["tid"])] += k["dur"]
    compute = {}
    for (pid, tid), t in kernel_time.items():
        if pid not in compute or t > kernel_time[compute[pid]]:
            compute[pid] = (pid, tid)
    prefetch = sorted(
        (c for c in copies
         if c["args"].get("kind") == "HtoD" and compute.get(c["pid"]) != (c["pid"], c["tid"])),
        key=lambda c: c["ts"],
    )

    # Step of each host op: the "step N" range it started in (same thread).
    steps = sorted(
        ((int(m.group(1)), e) for e in events if e.get("cat") == "user_annotation"
         for m in [re.fullmatch(r"step (\d+)", e.get("name", ""))] if m),
        key=lambda s: s[0],
    )
    step_of = {}
    for op in host_ops:
        for n, r in steps:
            if r["tid"] == op["tid"] and r["ts"] <= op["ts"] <= r["ts"] + r["dur"]:
                step_of[op["args"]["correlation"]] = n
                break
    compute_kernels = [k for k in kernels if compute.get(k["pid"]) == (k["pid"], k["tid"])]
    by_step = defaultdict(list)
    for k in compute_kernels:
        n = step_of.get(k["args"]["correlation"])
        if n is not None:
            by_step[n].append(k)

    print(f"trace {args[0]}: {len(streams)} stream track(s), {len(compute_kernels)} compute "
          f"kernels, {len(prefetch)} prefetch-stream copies, {len(steps)} profiled steps")
    for (pid, tid), name in sorted(streams.items()):
        role = ("compute" if compute.get(pid) == (pid, tid) else
                "prefetch" if any((c["pid"], c["tid"]) == (pid, tid) for c in prefetch) else "other")
        print(f"  cuda:{pid - 1} {name}: {role}")
    print(f"{'step':>8} {'kernels':>8} {'kernel us':>10} {'copies':>12} {'overlap us':>11}")
    per_step = []
    for n, _ in steps:
        ks = by_step.get(n, [])
        ov, which = 0.0, []
        for i, c in enumerate(prefetch):
            o = sum(overlap(c["ts"], c["ts"] + c["dur"], k["ts"], k["ts"] + k["dur"]) for k in ks)
            if o > 0:
                ov += o
                which.append(i)
        kt = sum(k["dur"] for k in ks)
        per_step.append({"step": n, "kernels": len(ks), "kernel_us": kt,
                         "overlapping_copies": which, "overlap_us": ov})
        print(f"{n:>8} {len(ks):>8} {kt:>10.1f} {','.join(map(str, which)) or '-':>12} {ov:>11.1f}")
    # Each prefetch copy: the step its host call came before (the prefetcher queues batch
    # N+1 when it hands out batch N, so a copy issued before step N's range carries batch N+1),
    # and the steps whose kernels it overlapped.
    host_copy_ts = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "copy"}
    per_copy = []
    print(f"{'copy':>6} {'issued before step':>19} {'dur us':>8} {'overlap us':>11}  overlapped steps")
    for i, c in enumerate(prefetch):
        ts = host_copy_ts.get(c["args"].get("correlation"))
        before = next((n for n, r in steps if ts is not None and r["ts"] >= ts), None)
        hits = {}
        for n, ks in by_step.items():
            o = sum(overlap(c["ts"], c["ts"] + c["dur"], k["ts"], k["ts"] + k["dur"]) for k in ks)
            if o > 0:
                hits[n] = o
        per_copy.append({"copy": i, "issued_before_step": before, "dur_us": c["dur"],
                         "overlap_us": sum(hits.values()), "overlapped_steps": sorted(hits)})
        print(f"{i:>6} {'-' if before is None else before:>19} {c['dur']:>8.1f} "
              f"{sum(hits.values()):>11.1f}  {','.join(map(str, sorted(hits))) or '-'}")
    copy_us = sum(c["dur"] for c in prefetch)
    overlapped = 0.0
    for c in prefetch:
        overlapped += sum(overlap(c["ts"], c["ts"] + c["dur"], k["ts"], k["ts"] + k["dur"])
                          for k in compute_kernels if k["pid"] == c["pid"])
    share = overlapped / copy_us if copy_us > 0 else 0.0
    print(f"total: prefetch copies {copy_us:.1f} us, overlapping compute kernels {overlapped:.1f} us "
          f"({100 * share:.1f}%)")
    if as_json:
        print(json.dumps({"trace": args[0], "stream_tracks": len(streams),
                          "prefetch_copies": len(prefetch), "prefetch_copy_us": copy_us,
                          "overlap_us": overlapped, "overlap_share": share, "steps": per_step,
                          "copies": per_copy}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
