"""Sleep and wake under berth:paged with a GPT-2-sized model and a KV-cache tag, on a GPU
(issue 31's measurement). Prints one JSON line per phase; exit status 1 if a check fails.

    python3 scripts/torch_live/sleep_wake.py [--kv-gib 8] [--cycles 20]

Phases: the pinned host-to-device bandwidth (1 GiB, CUDA events, median of 5); the model
(transformers' GPT2LMHeadModel, 124M parameters, fp32) built in region("weights"), a KV cache in
region("kv_cache"); a forward and a CUDA graph of it captured before sleep; sleep of both tags
(weights offloaded): the driver's used bytes before and after (torch.cuda.mem_get_info), the
time; wake: the time against size / bandwidth; the forward and the graph replay after wake
compared bit for bit with before; then `--cycles` cycles of a reinforcement-learning loop
(train a step of a separate, untagged model while the rollout tags sleep; wake them, generate,
sleep them again) with the driver's used bytes and the process's resident host memory in each
(no growth allowed); then the offloaded weights alone, slept and woken seven times with host
memory freed at wake and then kept.
"""
import argparse
import json
import sys
import time

import torch
import berth_torch

ap = argparse.ArgumentParser()
ap.add_argument("--kv-gib", type=float, default=8.0)
ap.add_argument("--cycles", type=int, default=20)
a = ap.parse_args()
berth_torch.use_allocator("paged")
failed = []


def say(**kw):
    print(json.dumps(kw), flush=True)


def check(cond, what):
    if not cond:
        failed.append(what)
        say(check=what, ok=False)


def used():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


# Pinned host-to-device bandwidth (outside any tag: untagged memory stays awake).
n = 1 << 30
host = torch.empty(n, dtype=torch.uint8).pin_memory()
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
times = []
for _ in range(6):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); dev.copy_(host, non_blocking=True); e.record(); e.synchronize()
    times.append(s.elapsed_time(e) / 1e3)
bw = n / sorted(times[1:])[2]
del host, dev
say(phase="bandwidth", h2d_pinned_gb_s=bw / 1e9)

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

torch.manual_seed(0)
with berth_torch.region("weights"):
    model = GPT2LMHeadModel(GPT2Config()).cuda().eval()
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
with berth_torch.region("kv_cache"):
    kv = torch.ones(int(a.kv_gib * (1 << 30)) // 2, dtype=torch.float16, device="cuda")
ids = torch.randint(0, 50257, (4, 128), device="cuda")
with torch.no_grad():
    before = model(ids).logits.clone()
    # A CUDA graph of the forward, captured before sleep (its own memory is untagged).
    static_ids = ids.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        model(static_ids)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_out = model(static_ids).logits
    g.replay()
    check(torch.equal(graph_out, before), "graph replay before sleep equals the forward")
kv_bytes = kv.numel() * kv.element_size()
say(phase="built", weight_bytes=weight_bytes, kv_bytes=kv_bytes,
    reserved=berth_torch.memory_reserved(), used=used())

u0 = used()
t = time.perf_counter()
r = berth_torch.sleep(["weights", "kv_cache"], offload=["weights"])
sleep_s = time.perf_counter() - t
u1 = used()
held = r["released_bytes"]
say(phase="sleep", released_bytes=held, offloaded_bytes=r["offloaded_bytes"],
    driver_used_before=u0, driver_used_after=u1, driver_freed=u0 - u1,
    freed_fraction=(u0 - u1) / held, seconds=sleep_s,
    offload_over_bandwidth=sleep_s / (r["offloaded_bytes"] / bw), stats=berth_torch.sleep_stats(),
    report=r)
check((u0 - u1) >= 0.99 * held, "sleep gives back >= 99% of the tags' bytes")
try:
    with berth_torch.region("kv_cache"):
        torch.empty(1 << 20, device="cuda")
    check(False, "an allocation in a sleeping tag is refused")
except Exception as e:  # noqa: BLE001 - the message is what is checked
    check("kv_cache" in str(e), "the refusal names the tag")
    say(phase="refused", error=str(e).splitlines()[0][:200])

t = time.perf_counter()
w = berth_torch.wake(["weights", "kv_cache"])
wake_s = time.perf_counter() - t
u2 = used()
say(phase="wake", mapped_bytes=w["mapped_bytes"], restored_bytes=w["restored_bytes"],
    seconds=wake_s, restore_over_bandwidth=wake_s / (w["restored_bytes"] / bw),
    driver_used_after=u2, report=w)
check(u2 == u0, "after wake the driver holds what it held before sleep")
with torch.no_grad():
    after = model(ids).logits
    check(torch.equal(after, before), "the forward after wake is bit-identical")
    static_ids.copy_(ids)
    g.replay()
    check(torch.equal(graph_out, before), "the graph captured before sleep replays bit-identically")
say(phase="after_wake", forward_equal=bool(torch.equal(after, before)),
    graph_equal=bool(torch.equal(graph_out, before)))

# The reinforcement-learning loop torch_memory_saver users run: a trainer's model (untagged, so
# it never sleeps) takes a step while the rollout tags sleep; then the rollout wakes, generates
# (a forward, the KV cache written) and sleeps again, its weights offloaded.
train_model = GPT2LMHeadModel(GPT2Config(n_layer=4)).cuda().train()
opt = torch.optim.AdamW(train_model.parameters(), lr=1e-5)


def train_step():
    loss = train_model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach().item()


train_step()  # gradients and the optimizer's state exist from here on
berth_torch.sleep(["weights", "kv_cache"], offload=["weights"])
per = []
losses = []
for c in range(a.cycles):
    losses.append(train_step())
    berth_torch.wake(["weights", "kv_cache"])
    with torch.no_grad():
        model(ids)  # generate: the rollout's weights and cache in use
    kv.fill_(1.0)
    torch.cuda.synchronize()
    awake = used()
    berth_torch.sleep(["weights", "kv_cache"], offload=["weights"])
    slept = used()
    berth_torch.kept_host_bytes()  # waits for the background free of the wake's backups
    per.append((slept, awake, rss()))
berth_torch.wake(["weights", "kv_cache"])
say(phase="cycles", cycles=a.cycles, driver_used_asleep=[p[0] for p in per],
    driver_used_awake=[p[1] for p in per], host_rss=[p[2] for p in per],
    train_loss=[round(x, 4) for x in losses])
if per:
    check(max(p[0] for p in per) == min(p[0] for p in per), "no device growth asleep")
    check(max(p[1] for p in per) == min(p[1] for p in per), "no device growth awake")
    check(per[-1][2] - per[0][2] < (64 << 20), "host memory does not grow (< 64 MiB over the cycles)")
# The offloaded weights alone, as a loop that sleeps every iteration runs them: host memory
# freed at wake (the default), then kept between sleeps (keep_host_memory(True)).
for keep in (False, True):
    berth_torch.keep_host_memory(keep)
    rounds = []
    for _ in range(7):
        torch.cuda.synchronize()
        t = time.perf_counter()
        rs = berth_torch.sleep("weights", offload="weights")
        ts = time.perf_counter() - t
        t = time.perf_counter()
        rw = berth_torch.wake("weights")
        tw = time.perf_counter() - t
        rounds.append((ts, tw, rs, rw))
    med_s = sorted(x[0] for x in rounds[1:])[3]
    med_w = sorted(x[1] for x in rounds[1:])[3]
    size = rounds[-1][2]["offloaded_bytes"]
    say(phase="weights_only", keep_host_memory=keep, offloaded_bytes=size,
        sleep_s=[x[0] for x in rounds], wake_s=[x[1] for x in rounds],
        median_sleep_over_bandwidth=med_s / (size / bw),
        median_wake_over_bandwidth=med_w / (size / bw),
        last_sleep=rounds[-1][2], last_wake=rounds[-1][3],
        kept_host_bytes=berth_torch.kept_host_bytes())
berth_torch.release_host_memory()
berth_torch.keep_host_memory(False)
with torch.no_grad():
    check(torch.equal(model(ids).logits, before), "the forward after the cycles is bit-identical")
say(phase="done", failed=failed)
sys.exit(1 if failed else 0)
