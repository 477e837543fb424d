"""What `torch.profiler` costs PyTorch's own `berth train` loop: the comparison for berth's
profiler (`berth train --profile`).

The loop is `torch_train.py`'s loader mode (MLP 784 -> 256 -> 10, SGD with momentum, batch 64,
DataLoader with 2 workers and pinned memory, non-blocking copies), run four ways in one process:
  off:      no profiler
  steps:    `torch.profiler.profile` with CPU and CUDA activities over 5 steps after 20 of
            warm-up (`schedule(wait=0, warmup=20, active=5, repeat=1)`), then off: what
            `berth train --profile` does by default
  all:      CPU and CUDA activities over every step of every epoch
  all-cpu:  CPU activity only over every step of every epoch
The ways alternate for --rounds rounds; one JSON line per run with its epoch seconds.
usage: torch_profile_cost.py TORCH_TRAIN_DIR DATA_DIR [--rounds 3] [--epochs 4]
"""
import argparse, json, statistics, sys, time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bench_dir", help="the folder holding torch_train.py")
    p.add_argument("data")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    a = p.parse_args()
    sys.path.insert(0, a.bench_dir)
    import torch, torch.nn as nn
    from torch.profiler import ProfilerActivity, profile, schedule
    from torch.utils.data import DataLoader, TensorDataset
    import torch_train

    dev = torch.device("cuda:0")
    xtr, ytr, _, _ = torch_train.load(a.data)

    def run(way):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        lossf = nn.CrossEntropyLoss()
        g = torch.Generator().manual_seed(0)
        loader = DataLoader(TensorDataset(xtr, ytr), batch_size=a.batch_size, shuffle=True,
                            num_workers=2, pin_memory=True, generator=g,
                            persistent_workers=True)
        prof = None
        if way == "steps":
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                           schedule=schedule(wait=0, warmup=20, active=5, repeat=1))
        elif way == "all":
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        elif way == "all-cpu":
            prof = profile(activities=[ProfilerActivity.CPU])
        if prof is not None:
            prof.__enter__()
        secs = []
        for _ in range(a.epochs):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            tot = torch.zeros((), device=dev)
            for xb, yb in loader:
                xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
                opt.zero_grad(set_to_none=True)
                loss = lossf(model(xb), yb)
                loss.backward()
                opt.step()
                tot += loss.detach()
                if way == "steps":
                    prof.step()
            torch.cuda.synchronize(dev)
            secs.append(time.perf_counter() - t0)
        if prof is not None:
            # Kineto's results are parsed here, after the timed epochs.
            prof.__exit__(None, None, None)
        print(json.dumps({"side": "pytorch", "way": way, "epoch_seconds": secs,
                          "torch": torch.__version__}), flush=True)
        return secs

    ways = ("off", "steps", "all", "all-cpu")
    runs = {w: [] for w in ways}
    run("off")  # warm-up: CUDA context, cuBLAS, the DataLoader's first workers
    for _ in range(a.rounds):
        for w in ways:
            runs[w].append(run(w))
    summary = {}
    for key, first in (("epochs_2_on", 1), ("all_epochs", 0)):
        med = {w: statistics.median(sum(s[first:]) / len(s[first:]) for s in v)
               for w, v in runs.items()}
        summary[key] = {"median_s": med,
                        "slowdown_vs_off_median": {w: med[w] / med["off"] - 1
                                                   for w in ways if w != "off"}}
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
