"""berth_torch compatibility checks: one PyTorch feature, under one allocator, in this process.

Each check exercises something an ordinary PyTorch program does (CUDA graphs, torch.compile,
memory pools, the memory-stats and snapshot APIs, empty_cache, the memory fraction, pinned
DataLoaders, NCCL, CUDA IPC, many threads on many streams, a training run, OOM errors) and
asserts real values. The allocator is chosen once per process, before CUDA starts, so each
(check, allocator) pair needs a fresh process; run_compat.py runs them all.

usage: python3 checks.py --allocator ALLOC --check NAME
       python3 checks.py --list
ALLOC: default (PyTorch's own allocator; berth_torch is not imported), berth:pytorch,
       berth:expandable or berth:paged (berth_torch.use_allocator(POLICY) right after
       `import torch`).

Prints exactly one JSON line last on stdout:
    {"check": ..., "allocator": ..., "verdict": "pass" | "fail" | "skip" | "refused",
     "detail": ...}
detail: a short measured value for a pass, the reason for a skip, the policy's reason and what
to do instead for a refusal (where that is the policy's documented answer), and for a fail the
failing step and exception on the first line, then the traceback's tail. Exit status 0 on pass,
skip or refused, 1 on fail. Without a CUDA device every check is a skip ("no CUDA device").
"""
import argparse
import contextlib
import json
import math
import os
import socket
import sys
import tempfile
import threading
import time
import traceback

# torch is imported in run(), not here: `--list` (used by run_compat.py and the pytest wrapper
# at collection time) must answer fast and work where torch is not installed. The checks
# below use this module-level name once run() has set it.
torch = None

from harness import (
    CHECKS, GiB, MiB, Refused, Skip, _STEP, check, cuda, driver_used_bytes, expect, step)

ALLOCATORS = ("default", "berth:pytorch", "berth:expandable", "berth:paged")


def oom_type():
    # torch.OutOfMemoryError since 2.5; before that only torch.cuda.OutOfMemoryError.
    return getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def seeded(*shape, seed=0):
    """A deterministic float32 tensor made on the CPU (the same on every allocator), on CUDA."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(cuda())


# -- the checks ------------------------------------------------------------------------------

@check
def check_cuda_graph(alloc):
    dev = cuda()
    w1, b1, w2 = seeded(256, 256, seed=1), seeded(256, seed=2), seeded(256, 128, seed=3)

    def f(x):  # intermediates freed during capture stay in the graph's private pool
        return torch.relu(x @ w1 + b1) @ w2

    static_x = seeded(256, 256, seed=4)
    # Warm-up on a side stream, as PyTorch's CUDA graphs docs do: it keeps lazy initialisation
    # (cuBLAS handles and workspaces) out of the capture.
    step("warm-up on a side stream")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            f(static_x)
    torch.cuda.current_stream().wait_stream(s)
    step("capture")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = f(static_x)
    # The graph's pool must survive empty_cache and must not be handed to eager tensors: the
    # "junk" below is allocated after capture, in sizes of the graph's intermediates, and a
    # replay must neither write into it nor have its own output overwritten by it.
    step("empty_cache after capture")
    torch.cuda.empty_cache()
    previous = None
    for i in range(3):
        step(f"replay {i}")
        new_x = seeded(256, 256, seed=10 + i)
        static_x.copy_(new_x)
        junk = [torch.full((256, 256), 7.0 + k, device=dev) for k in range(8)]
        g.replay()
        torch.cuda.synchronize()
        expected = f(new_x)
        err = (static_y - expected).abs().max().item()
        expect(torch.allclose(static_y, expected, rtol=1e-4, atol=1e-4),
               f"replay {i}: graph output differs from eager by {err:.3g}")
        intact = [bool((j == 7.0 + k).all()) for k, j in enumerate(junk)]
        expect(all(intact), f"replay {i}: an eager tensor allocated after capture was "
               "overwritten")
        if previous is not None:
            expect(not torch.allclose(static_y, previous), f"replay {i}: output did not change")
        previous = static_y.clone()
        del junk
    step("teardown")
    del g, static_y
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return f"3 replays match eager (last max abs err {err:.2g})"


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)).to(cuda())


def _need_triton():
    # Inductor compiles CUDA kernels with Triton; without it torch.compile fails for every
    # allocator alike, which says nothing about the allocator.
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return
    if not has_triton():
        raise Skip("Triton is not installed (torch.compile's CUDA backend needs it)")


def _compare_compiled(mode, calls, seed):
    """Calls torch.compile(mlp, mode=mode) `calls` times on new inputs, each output compared
    with eager before the next call (which may overwrite it: with CUDA graphs the outputs live
    in the graph's pool). Returns the largest difference."""
    _need_triton()
    model = _mlp()
    compiled = torch.compile(model, mode=mode)
    worst = 0.0
    with torch.no_grad():
        for i in range(calls):
            step(f"compiled call {i}")
            x = seeded(32, 64, seed=seed + i)
            got = compiled(x)
            want = model(x)
            err = (got - want).abs().max().item()
            worst = max(worst, err)
            expect(torch.allclose(got, want, rtol=1e-3, atol=1e-4),
                   f"call {i}: compiled output differs from eager by {err:.3g}")
    return worst


@check
def check_compile_default(alloc):
    worst = _compare_compiled(None, 2, seed=20)
    return f"2 calls match eager (max abs err {worst:.2g})"


@check
def check_compile_reduce_overhead(alloc):
    from torch._dynamo.utils import counters
    # cudagraph trees run eagerly first (warm-up), record on a later call, then replay: five
    # calls cover all three.
    worst = _compare_compiled("reduce-overhead", 5, seed=30)
    # If inductor skipped CUDA graphs, the graph-pool path this check is about never ran.
    skips = counters["inductor"].get("cudagraph_skips", 0)
    expect(skips == 0, f"inductor skipped CUDA graphs {skips} time(s); see stderr for why")
    return f"5 calls match eager (max abs err {worst:.2g}), cudagraphs used"


@check
def check_compile_reduce_overhead_new_shapes(alloc):
    """torch.compile(mode="reduce-overhead") when input shapes change: CUDA-graph trees record
    a new graph after replaying others, first setting the graph pool back to its checkpoint
    (setCheckpointPoolState). Inference with changing batch sizes, then training (forward
    and backward graphs) whose batch size changes mid-run, each compared with eager."""
    import copy

    from torch._dynamo.utils import counters
    _need_triton()
    restores = [0]
    original = torch._C._cuda_setCheckpointPoolState

    def counted(*args, **kwargs):
        restores[0] += 1
        return original(*args, **kwargs)

    torch._C._cuda_setCheckpointPoolState = counted
    worst = 0.0
    try:
        model = _mlp()
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
        with torch.no_grad():
            for i, b in enumerate([8, 8, 8, 16, 16, 16, 8, 32, 8]):
                step(f"inference call {i} (batch {b})")
                x = seeded(b, 64, seed=40 + i)
                got = compiled(x)
                want = model(x)
                err = (got - want).abs().max().item()
                worst = max(worst, err)
                expect(torch.allclose(got, want, rtol=1e-3, atol=1e-4),
                       f"inference call {i}: compiled output differs from eager by {err:.3g}")
        trained = _mlp()
        eager = copy.deepcopy(trained)
        compiled = torch.compile(trained, mode="reduce-overhead")
        opt_c = torch.optim.SGD(trained.parameters(), lr=0.01)
        opt_e = torch.optim.SGD(eager.parameters(), lr=0.01)
        for i, b in enumerate([16, 16, 16, 16, 32, 32, 32, 16, 16]):
            step(f"training step {i} (batch {b})")
            x = seeded(b, 64, seed=60 + i)
            losses = []
            for m, opt in ((compiled, opt_c), (eager, opt_e)):
                loss = m(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.detach().item())
            err = abs(losses[0] - losses[1])
            worst = max(worst, err)
            expect(math.isclose(losses[0], losses[1], rel_tol=1e-3, abs_tol=1e-5),
                   f"training step {i}: compiled loss {losses[0]} against eager {losses[1]}")
    finally:
        torch._C._cuda_setCheckpointPoolState = original
    expect(restores[0] > 0, "no checkpoint restore ran: the shapes did not make CUDA-graph "
           "trees record after replaying, so this check showed nothing")
    skips = counters["inductor"].get("cudagraph_skips", 0)
    expect(skips == 0, f"inductor skipped CUDA graphs {skips} time(s); see stderr for why")
    return (f"{restores[0]} checkpoint restores; 9 inference calls and 9 training steps match "
            f"eager (max abs err {worst:.2g})")


# The MemPool checks (their own file, registered here so the table keeps its order).
import pool_checks  # noqa: E402,F401


@check
def check_memory_stats(alloc):
    dev = cuda()
    torch.ones(1, device=dev)
    torch.cuda.synchronize()
    step("memory_allocated()")
    base = torch.cuda.memory_allocated()
    x = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
    now = torch.cuda.memory_allocated()
    expect(now - base >= 64 * MiB,
           f"memory_allocated grew by {now - base} bytes for a 64 MiB tensor")
    step("memory_stats()")
    st = torch.cuda.memory_stats()
    expect(st.get("allocated_bytes.all.current") == now,
           f"memory_stats()['allocated_bytes.all.current'] = "
           f"{st.get('allocated_bytes.all.current')}, memory_allocated() = {now}")
    step("max/reserved")
    expect(torch.cuda.max_memory_allocated() >= now, "max_memory_allocated < memory_allocated")
    reserved = torch.cuda.memory_reserved()
    expect(reserved >= now, f"memory_reserved {reserved} < memory_allocated {now}")
    expect(torch.cuda.max_memory_reserved() >= reserved, "max_memory_reserved < memory_reserved")
    step("memory_summary()")
    summary = torch.cuda.memory_summary()
    expect(isinstance(summary, str) and summary.strip(), "memory_summary() is empty")
    step("free")
    del x
    after = torch.cuda.memory_allocated()
    expect(after == base, f"memory_allocated is {after} after freeing, was {base} before")
    expect(torch.cuda.max_memory_allocated() >= base + 64 * MiB, "the peak forgot the 64 MiB")
    step("reset_peak_memory_stats()")
    torch.cuda.reset_peak_memory_stats()
    peak = torch.cuda.max_memory_allocated()
    expect(peak == after, f"max_memory_allocated is {peak} after reset_peak, current {after}")
    step("reset_accumulated_memory_stats()")
    torch.cuda.reset_accumulated_memory_stats()
    acc = torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0)
    expect(acc == 0, f"allocated_bytes.all.allocated is {acc} after reset_accumulated")
    y = torch.empty(MiB, dtype=torch.uint8, device=dev)
    acc = torch.cuda.memory_stats().get("allocated_bytes.all.allocated", 0)
    expect(acc >= MiB, f"allocated_bytes.all.allocated is {acc} after a 1 MiB allocation")
    del y
    return f"+{(now - base) / MiB:.0f} MiB for 64 MiB, {len(st)} stats keys, resets work"


@check
def check_snapshot(alloc):
    dev = cuda()
    step("_record_memory_history()")
    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        step("allocate/free while recording")
        keep = torch.ones(2 * MiB, device=dev)
        gone = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
        gone_ptr = gone.data_ptr()
        del gone
        torch.cuda.synchronize()
        step("_snapshot()")
        s = torch.cuda.memory._snapshot()
        expect(len(s.get("segments", [])) > 0, "snapshot has no segments with a tensor alive")
        traces = s.get("device_traces") or [[]]
        actions = [e.get("action") for e in traces[0]]
        expect("alloc" in actions, f"device_traces[0] has no 'alloc' action ({len(actions)} "
               "entries)")
        expect(any(e.get("action") == "alloc" and e.get("addr") == gone_ptr
                   and e.get("size", 0) >= 8 * MiB for e in traces[0]),
               "no 'alloc' trace entry for the 8 MiB tensor's address")
        expect(any(e.get("action", "").startswith("free") and e.get("addr") == gone_ptr
                   for e in traces[0]), "no free trace entry for the freed 8 MiB tensor")
        step("_dump_snapshot()")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snapshot.pickle")
            torch.cuda.memory._dump_snapshot(path)
            size = os.path.getsize(path)
            expect(size > 0, "_dump_snapshot wrote an empty file")
            import pickle
            with open(path, "rb") as f:
                dumped = pickle.load(f)
        expect(len(dumped.get("segments", [])) > 0, "the dumped snapshot has no segments")
        step("memory_viz")
        from torch.cuda import _memory_viz as viz
        # segsum and trace parse the blocks and entries (segsum checks that each segment's
        # blocks add up to its size); the HTML plots only embed the pickle in a template.
        if hasattr(viz, "segsum"):
            expect("total_reserved" in viz.segsum(dumped), "memory_viz segsum output looks wrong")
        if hasattr(viz, "trace"):
            expect("entries" in viz.trace(dumped), "memory_viz trace output looks wrong")
        plots = [n for n in ("trace_plot", "segment_plot") if hasattr(viz, n)]
        if not plots:
            raise Skip(f"torch {torch.__version__}'s _memory_viz has no trace_plot/segment_plot")
        for n in plots:
            html = getattr(viz, n)(dumped)
            expect(isinstance(html, str) and len(html) > 1000 and "<" in html,
                   f"_memory_viz.{n} returned no HTML")
        del keep
    finally:
        step("_record_memory_history(enabled=None)")
        torch.cuda.memory._record_memory_history(enabled=None)
    return (f"{len(s['segments'])} segments, {len(actions)} trace entries, dump {size} B, "
            f"{'+'.join(plots)} ok")


@check
def check_empty_cache(alloc):
    dev = cuda()
    torch.ones(1, device=dev)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    used0 = driver_used_bytes()
    step("allocate 1 GiB")
    big = torch.empty(GiB, dtype=torch.uint8, device=dev)
    big.fill_(1)  # touched, so nothing can stay merely reserved
    torch.cuda.synchronize()
    grown = driver_used_bytes() - used0
    expect(grown >= GiB, f"the driver sees only {grown / MiB:.0f} MiB more for a 1 GiB tensor")
    step("memory_reserved() while allocated")
    reserved_before = torch.cuda.memory_reserved()
    step("free + empty_cache()")
    del big
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    left = driver_used_bytes() - used0
    expect(left <= 64 * MiB, f"{left / MiB:.0f} MiB still used at the driver after empty_cache "
           "(allowed: 64 MiB)")
    step("memory_reserved() after empty_cache")
    reserved_after = torch.cuda.memory_reserved()
    expect(reserved_after < reserved_before,
           f"memory_reserved did not drop: {reserved_before} -> {reserved_after}")
    return (f"driver +{grown / MiB:.0f} MiB then {left / MiB:+.0f} MiB; reserved "
            f"{reserved_before / MiB:.0f} -> {reserved_after / MiB:.0f} MiB")


@check
def check_memory_fraction(alloc):
    dev = cuda()
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.ones(1, device=dev)
    step("set_per_process_memory_fraction(0.1)")
    torch.cuda.set_per_process_memory_fraction(0.1)
    try:
        step("a request of 50% of the device")
        try:
            t = torch.empty(total // 2, dtype=torch.uint8, device=dev)
        except oom_type() as e:
            msg = str(e).splitlines()[0] if str(e) else ""
        else:
            del t
            raise AssertionError("a 50% request succeeded under a 0.1 memory fraction")
        # The cap is a cap, not a refusal of everything large: 5% fits under 10%.
        step("a request of 5% of the device")
        t = torch.empty(total // 20, dtype=torch.uint8, device=dev)
        del t
        step("a 16 MiB request")
        t = torch.ones(16 * MiB, dtype=torch.uint8, device=dev)
        expect(int(t.sum()) == 16 * MiB, "the 16 MiB tensor holds wrong values")
        del t
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    step("a 20% request after raising the fraction to 1.0")
    t = torch.empty(total // 5, dtype=torch.uint8, device=dev)
    del t
    torch.cuda.empty_cache()
    return f"50% refused ({msg[:60]}), 5%, 16 MiB and (at 1.0) 20% served"


@check
def check_dataloader_pin(alloc):
    from torch.utils.data import DataLoader, TensorDataset
    dev = cuda()
    n, d, bs = 1000, 96, 64
    # float64 of small integers: sums are exact, so GPU and CPU sums must be equal.
    xs = torch.arange(n * d, dtype=torch.float64).reshape(n, d) % 97
    ys = torch.arange(n, dtype=torch.int64)
    loader = DataLoader(TensorDataset(xs, ys), batch_size=bs, num_workers=2, pin_memory=True)
    batches = 0
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for i, (xb, yb) in enumerate(loader):
        step(f"batch {i}")
        expect(xb.is_pinned() and yb.is_pinned(), f"batch {i} is not pinned")
        xg, yg = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
        got = xg.sum()
        expect(got.item() == xb.sum().item(), f"batch {i}: GPU sum {got.item()} != CPU sum")
        expect(int(yg.sum()) == int(yb.sum()), f"batch {i}: label sums differ")
        total += got
        batches += 1
    expect(batches == math.ceil(n / bs), f"{batches} batches, expected {math.ceil(n / bs)}")
    expect(total.item() == xs.sum().item(), "the sum over all batches differs")
    return f"{batches} pinned batches, sums equal"


@check
def check_nccl_one_rank(alloc):
    import datetime
    import torch.distributed as dist
    if not dist.is_available():
        raise Skip("torch.distributed is not available in this build")
    if not dist.is_nccl_available():
        raise Skip("NCCL is not available in this build")
    with socket.socket() as s:  # a free port on loopback for the TCP rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dev = cuda()
    step("init_process_group")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        step("all_reduce")
        t = torch.arange(1024, dtype=torch.float32, device=dev)
        dist.all_reduce(t)
        step("all_gather_into_tensor")
        gathered = torch.empty(1024, dtype=torch.float32, device=dev)
        dist.all_gather_into_tensor(gathered, torch.arange(1024.0, device=dev) * 2)
        torch.cuda.synchronize()
        expect(torch.equal(t, torch.arange(1024, dtype=torch.float32, device=dev)),
               "all_reduce over one rank changed the tensor")
        expect(torch.equal(gathered, torch.arange(1024.0, device=dev) * 2),
               "all_gather_into_tensor over one rank gave wrong values")
    finally:
        step("destroy_process_group")
        dist.destroy_process_group()
    return f"all_reduce + all_gather over 1 rank ok, sum {t.sum().item():.0f}"


def _ipc_child(allocator, tensors, replies):
    """The spawned child: installs the parent's allocator (PyTorch does not carry it over),
    receives the tensor, answers with its sum. Replies are (kind, value) pairs."""
    try:
        import torch as t
        if allocator.startswith("berth:") and not t.cuda.is_initialized():
            import berth_torch
            berth_torch.use_allocator(allocator.split(":", 1)[1])
        x = tensors.get()
        replies.put(("received", None))
        replies.put(("sum", float(x.sum().item())))
        del x
    except BaseException as e:  # noqa: BLE001 - whatever it is goes back to the parent
        replies.put(("error", f"{type(e).__name__}: {e}"))


def _wait_reply(replies, child, deadline, before, hang_msg):
    """The child's next reply; fails with hang_msg at the deadline, or when the child died
    `before` replying."""
    import queue
    while True:
        try:
            return replies.get(timeout=0.5)
        except queue.Empty:
            if not child.is_alive():
                # It may have replied just before exiting: one last look.
                try:
                    return replies.get(timeout=2)
                except queue.Empty:
                    raise AssertionError(
                        f"child exited with code {child.exitcode} before {before}") from None
            if time.monotonic() > deadline:
                raise AssertionError(hang_msg)


@check
def check_ipc(alloc):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    # A SimpleQueue pickles in the calling thread, so a tensor that cannot be shared raises
    # here with its message; mp.Queue would pickle in its feeder thread and just drop it.
    tensors, replies = ctx.SimpleQueue(), ctx.Queue()
    x = torch.arange(100_000, dtype=torch.float32, device=cuda()) / 7
    want = float(x.sum().item())
    step("start the child")
    child = ctx.Process(target=_ipc_child, args=(alloc, tensors, replies), daemon=True)
    child.start()
    try:
        step("send the tensor")
        tensors.put(x)
        deadline = time.monotonic() + 60
        kind, value = _wait_reply(replies, child, deadline, "receiving the tensor",
                                  "hung: child never received the tensor")
        if kind == "received":
            kind, value = _wait_reply(replies, child, deadline, "answering",
                                      "hung: child received the tensor but never answered")
        expect(kind != "error", f"child failed: {value}")
        expect(kind == "sum" and math.isclose(value, want, rel_tol=1e-6),
               f"child read sum {value}, parent has {want}")
        child.join(timeout=10)
    finally:
        if child.is_alive():
            child.kill()
        child.join(timeout=10)
    del x  # only after the child is gone: the parent must keep a shared tensor alive
    return f"child read the shared tensor: sum {value:.6g}"


@check
def check_threads_streams(alloc):
    dev = cuda()
    n_threads, iters = 8, 50
    inputs = [(seeded(256, 256, seed=100 + i), seeded(256, 256, seed=200 + i))
              for i in range(n_threads)]
    torch.cuda.synchronize()
    results, errors = [None] * n_threads, []

    def worker(i):
        try:
            s = torch.cuda.Stream()
            a, b = inputs[i]
            with torch.cuda.stream(s):
                acc = torch.zeros(256, 256, device=dev)
                bad = torch.zeros((), dtype=torch.int64, device=dev)
                for k in range(iters):
                    # A tag tensor of a varying size, checked after more allocations on
                    # every thread: a block given to two live tensors shows up as a wrong tag.
                    tag = torch.full(((k % 7 + 1) * 4096,), float(i * 1000 + k), device=dev)
                    x = a @ b
                    y = torch.tanh(x * (1.0 / 256))
                    acc += y
                    bad += (tag != float(i * 1000 + k)).sum()
                    del x, y, tag
                s.synchronize()
            results[i] = (acc, bad)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    step("run threads")
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    expect(not any(t.is_alive() for t in threads), "a worker thread hung (60 s)")
    torch.cuda.synchronize()
    expect(not errors, "; ".join(errors))
    step("check results")
    worst = 0.0
    for i, (acc, bad) in enumerate(results):
        a, b = inputs[i]
        want = torch.tanh((a @ b) * (1.0 / 256)) * iters
        expect(int(bad) == 0, f"thread {i}: {int(bad)} tag elements were overwritten")
        worst = max(worst, (acc - want).abs().max().item())
        expect(torch.allclose(acc, want, rtol=1e-4, atol=1e-3),
               f"thread {i}: result differs from the reference by {worst:.3g}")
    return f"{n_threads} threads x {iters} iterations, max abs err {worst:.2g}"


def _train_model():
    try:
        import torchvision
    except Exception:  # noqa: BLE001 - absent or broken: the small CNN does the same job
        torchvision = None
    torch.manual_seed(0)  # parameters are initialised on the CPU, so identical everywhere
    if torchvision is not None:
        return "resnet18", torchvision.models.resnet18(num_classes=10), (16, 3, 64, 64)
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return "small_cnn", model, (16, 3, 32, 32)


@check
def check_train_losses(alloc):
    # Deterministic kernels: the same losses on every allocator, to the bit in practice
    # (run_compat.py compares with rtol 1e-5). An allocator can only change numerics by
    # handing out memory that is still in use, or by alignment-dependent kernel choices.
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    name, model, shape = _train_model()
    model = model.to(cuda())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1234)
    losses = []
    for i in range(5):
        step(f"training step {i}")
        x = torch.randn(*shape, generator=g).to(cuda())
        y = torch.randint(0, 10, (shape[0],), generator=g).to(cuda())
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    expect(all(math.isfinite(v) for v in losses), f"non-finite loss: {losses}")
    expect(losses[-1] != losses[0], f"the loss never changed: {losses}")
    # repr-exact floats; run_compat.py parses the list after "losses=".
    return f"losses={json.dumps(losses)} model={name}"


@check
def check_oom_error_type(alloc):
    dev = cuda()
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.ones(1, device=dev)
    step("a request of 4x the device")
    try:
        t = torch.empty(4 * total, dtype=torch.uint8, device=dev)
    except oom_type() as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        expect(msg, "torch.OutOfMemoryError with an empty message")
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        raise AssertionError(f"raised {type(e).__module__}.{type(e).__name__}, not "
                             f"torch.OutOfMemoryError: {str(e)[:200]}") from e
    else:
        del t
        raise AssertionError(f"a request of {4 * total / GiB:.0f} GiB succeeded")
    step("a small request after the OOM")
    t = torch.ones(16 * MiB, dtype=torch.uint8, device=dev)
    expect(int(t.sum()) == 16 * MiB, "the 16 MiB tensor after the OOM holds wrong values")
    return f"torch.OutOfMemoryError: {msg[:80]}"


# -- running one check -----------------------------------------------------------------------

def _fail_detail(exc):
    """`[step] Type: message` on the first line, then the traceback's tail."""
    first = f"[{_STEP[0]}] {type(exc).__name__}: {str(exc).strip()}".splitlines()[0]
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return first + "\n" + tb[-2000:]


def run(alloc, name):
    """Installs the allocator, runs check `name`; returns (verdict, detail)."""
    global torch
    try:
        import torch as t
    except Exception as e:  # noqa: BLE001
        return "skip", f"torch not importable: {type(e).__name__}: {e}"
    torch = t
    berth = None
    unavailable = install_error = None
    if alloc != "default":
        # First thing after `import torch`: the allocator can only be switched before CUDA
        # starts. Errors are held back until we know a device exists, so that a machine
        # without one answers "no CUDA device" for every check, as documented.
        try:
            import berth_torch as berth
        except Exception as e:  # noqa: BLE001
            unavailable = f"berth_torch not importable: {type(e).__name__}: {e}"
        else:
            try:
                berth.use_allocator(alloc.split(":", 1)[1])
            except Exception as e:  # noqa: BLE001
                install_error = e
    if not torch.cuda.is_available():
        return "skip", "no CUDA device"
    if unavailable:
        return "skip", unavailable
    if install_error is not None:
        step(f"berth_torch.use_allocator({alloc.split(':', 1)[1]!r})")
        return "fail", _fail_detail(install_error)
    if berth is not None and hasattr(berth, "installed_policy"):
        got = berth.installed_policy()
        if got != alloc.split(":", 1)[1]:
            return "fail", f"berth_torch.installed_policy() is {got!r} after use_allocator"
    try:
        # Stray prints from the check or torch go to stderr: the JSON line must be the last
        # line on stdout.
        with contextlib.redirect_stdout(sys.stderr):
            detail = CHECKS[name](alloc)
            if berth is not None and hasattr(berth, "check_errors"):
                # Hooks that return nothing to PyTorch (free, record_stream, empty_cache)
                # park their errors; a check that "passed" over a failed free did not pass.
                step("berth_torch.check_errors()")
                berth.check_errors()
    except Skip as e:
        return "skip", str(e)
    except Refused as e:
        if berth is not None and hasattr(berth, "check_errors"):
            # A refusal over a failed free is no refusal either.
            try:
                berth.check_errors()
            except Exception as err:  # noqa: BLE001 - every failure becomes a verdict
                step("berth_torch.check_errors()")
                return "fail", _fail_detail(err)
        return "refused", str(e)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a verdict
        if isinstance(e, KeyboardInterrupt):
            raise
        return "fail", _fail_detail(e)
    return "pass", detail


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocator", default="default", choices=ALLOCATORS)
    ap.add_argument("--check", choices=sorted(CHECKS), help="the check to run")
    ap.add_argument("--list", action="store_true", help="print the check names and exit")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(CHECKS))
        return 0
    if not args.check:
        ap.error("give --check NAME (or --list)")
    verdict, detail = run(args.allocator, args.check)
    sys.stderr.flush()
    print(json.dumps({"check": args.check, "allocator": args.allocator, "verdict": verdict,
                      "detail": detail}), flush=True)
    return 1 if verdict == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
