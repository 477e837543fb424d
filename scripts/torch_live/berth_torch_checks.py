"""Checks of berth_torch inside live PyTorch, one process per check (an allocator is chosen once
per process). Prints one JSON line.

usage: berth_torch_checks.py record_stream POLICY N   # consumer held back by a long kernel
       berth_torch_checks.py oom POLICY               # a request larger than the card, then more
       berth_torch_checks.py errors                   # the errors a user meets, hooks reached
       berth_torch_checks.py late                     # use_allocator after CUDA started
       berth_torch_checks.py snapshot POLICY DIR TORCH_LIVE_PY   # resnet50_train, then memory_viz
POLICY: a berth policy, or "default" for PyTorch's own allocator (the reference)."""
import json, os, runpy, subprocess, sys

mode = sys.argv[1]
import torch  # noqa: E402

berth = None
if mode not in ("errors", "late") and sys.argv[2] != "default":
    import berth_torch as berth
    berth.use_allocator(sys.argv[2])
out = {"check": mode, "allocator": sys.argv[2] if len(sys.argv) > 2 else None}


def stats():
    return berth.memory_stats() if berth else torch.cuda.memory_stats()


if mode == "record_stream":
    n = int(sys.argv[3])
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    correct = reused = 0
    # One untimed warm-up round first: the first launches of _sleep and the reduction load
    # their kernels (lazy module loading), which can let the consumer finish early; PyTorch's
    # own allocator "reuses" once there too.
    for i in range(-1, n):
        x = torch.full((1 << 20,), float(i), device="cuda")  # 4 MiB, written on main
        ptr = x.data_ptr()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # holds the consumer back ~10 ms
            total = x.sum()  # reads x only after the sleep
        x.record_stream(side)
        del x
        y = torch.full((1 << 20,), -1.0, device="cuda")  # same size on main, right away
        reused += i >= 0 and y.data_ptr() == ptr
        torch.cuda.synchronize()
        correct += i >= 0 and float(total) == float(i) * (1 << 20)
        del y, total
    out.update(tries=n, correct=correct, reused_before_event=reused,
               stats_keys=sorted(stats().keys()))

elif mode == "oom":
    try:
        torch.empty(1 << 42, dtype=torch.uint8, device="cuda")  # 4 TiB
        out["raised"] = None
    except Exception as e:  # noqa: BLE001 - the type is what is measured
        out.update(raised=type(e).__name__, is_torch_oom=isinstance(e, torch.OutOfMemoryError),
                   message=str(e)[:400])
    y = torch.ones(10, device="cuda") * 3
    out["after_oom_sum"] = float(y.sum())
    out["num_ooms"] = stats().get("num_ooms")

elif mode == "errors":
    import berth_torch
    try:
        berth_torch.use_allocator("cudaMallocAsync")
    except ValueError as e:
        out["unknown_policy"] = str(e)
    berth_torch.use_allocator("paged")
    x = torch.randn(1 << 20, device="cuda")
    out["allocated_after_randn"] = berth_torch.memory_allocated()
    del x
    reserved_before = berth_torch.memory_reserved()
    torch.cuda.empty_cache()  # through the reset hook
    out["reserved_before_after_empty_cache"] = [reserved_before, berth_torch.memory_reserved()]
    torch.cuda.set_per_process_memory_fraction(0.5)  # through the fraction hook
    try:
        torch.empty(100 << 30, dtype=torch.uint8, device="cuda")  # over half of the card
        out["fraction_cap"] = "not enforced"
    except torch.OutOfMemoryError as e:
        out["fraction_cap"] = str(e)[:200]
    torch.cuda.set_per_process_memory_fraction(1.0)
    out["summary_head"] = berth_torch.memory_summary(abbreviated=True).splitlines()[:4]
    try:
        torch.cuda.memory_stats()
        out["torch_memory_stats"] = "works"
    except Exception as e:  # noqa: BLE001
        out["torch_memory_stats"] = f"{type(e).__name__}: {str(e)[:100]}"
    # A second process would be needed to show the after-CUDA-started error cleanly: here
    # CUDA started, so asking for another policy must raise.
    try:
        berth_torch.use_allocator("pytorch")
        out["second_policy"] = "allowed"
    except RuntimeError as e:
        out["second_policy"] = str(e)[:200]
    berth_torch.check_errors()
    out["hook_errors"] = "none"

elif mode == "late":
    import berth_torch
    torch.zeros(1, device="cuda")
    try:
        berth_torch.use_allocator("paged")
        out["late_install"] = "allowed"
    except RuntimeError as e:
        out["late_install"] = str(e)

elif mode == "snapshot":
    outdir, live = sys.argv[3], sys.argv[4]
    berth.record_memory_history(max_entries=200_000)
    sys.argv = [live, "resnet50_train", "--allocator", f"berth:{sys.argv[2]}"]
    runpy.run_path(live, run_name="__main__")
    path = os.path.join(outdir, "resnet50_train.snapshot.pickle")
    berth.dump_snapshot(path)
    out["snapshot_bytes"] = os.path.getsize(path)
    for plot in ("trace_plot", "segment_plot"):
        html = os.path.join(outdir, f"resnet50_train.{plot}.html")
        r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", plot, path, "-o", html],
                           capture_output=True, text=True)
        out[plot] = {"rc": r.returncode, "html_bytes": os.path.getsize(html) if os.path.exists(html) else 0,
                     "stderr": r.stderr[-300:]}

print(json.dumps(out), flush=True)
