"""Runs berth_torch's compatibility suite: every check of checks.py under PyTorch's own allocator
and under each berth policy, in the same run, and prints the comparison as a Markdown table.

usage: python3 run_compat.py [--out DIR] [--allocators A,B,..] [--checks C,D,..] [--timeout S]

Each (check, allocator) pair runs in a fresh process (`python checks.py --allocator A --check C`),
since an allocator can only be chosen before CUDA starts. Pairs are interleaved per check (every
allocator for the first check, then for the next), so slow drift of the machine falls on all
allocators alike. A run past --timeout (default 120 s) is a fail "timed out".

Writes DIR/compat.jsonl (one record per pair: the check's JSON line, with the verdict and detail
the table shows, plus wall_s and rc) and DIR/logs/CHECK.ALLOCATOR.{out,err}; prints the table
(one row per check, one column per allocator) and "N of M berth cells pass where default
passes" on stdout, progress on stderr. A cell "refused" is a policy's documented refusal,
checked to say why and what to do instead; it is not counted as a failure. train_losses passes under a berth allocator only if its
losses equal default's (allclose, rtol 1e-5): an allocator must not change numerics.

Allocators: --allocators, else env BERTH_TORCH_ALLOCATORS (comma or space separated), else
default, berth:pytorch, berth:expandable, berth:paged. Exit status 1 when a berth cell fails
where default passes, else 0. On the GPU machine, run it through scripts/torch-compat.sh.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKS_PY = os.path.join(HERE, "checks.py")
ALLOCATORS = ("default", "berth:pytorch", "berth:expandable", "berth:paged")
DEFAULT_TIMEOUT_S = 120
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-8  # numpy's allclose atol; the losses are O(1)


def split_names(text):
    """'a, b c' -> ['a', 'b', 'c']."""
    return [n for n in re.split(r"[,\s]+", text or "") if n]


def allocators_from(arg=None):
    """--allocators, else env BERTH_TORCH_ALLOCATORS, else all four."""
    names = split_names(arg) or split_names(os.environ.get("BERTH_TORCH_ALLOCATORS"))
    names = names or list(ALLOCATORS)
    bad = [n for n in names if n not in ALLOCATORS]
    if bad:
        raise ValueError(f"unknown allocator(s) {', '.join(bad)}: use {', '.join(ALLOCATORS)}")
    return names


def list_checks():
    """The check names, from `checks.py --list` (which imports no torch)."""
    r = subprocess.run([sys.executable, CHECKS_PY, "--list"], capture_output=True, text=True,
                       check=True, timeout=60)
    return r.stdout.split()


def last_json(text):
    """The last stdout line that is a verdict record, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "verdict" in rec:
                return rec
    return None


def _tail(path, n=1):
    try:
        with open(path, errors="replace") as f:
            lines = [l.strip() for l in f.read().splitlines() if l.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def run_one(check, alloc, timeout=DEFAULT_TIMEOUT_S, logdir=None):
    """Runs one pair in a fresh process; returns its record (check, allocator, verdict, detail,
    wall_s, rc). Never raises for what the check did."""
    own_tmp = None
    if logdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="berth-compat-")
        logdir = own_tmp.name
    os.makedirs(logdir, exist_ok=True)
    stem = os.path.join(logdir, f"{check}.{alloc.replace(':', '_')}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    # Output goes to files, not pipes, and the child leads its own process group: a check's
    # grandchildren (DataLoader workers, the IPC child, inductor's compile workers) could
    # otherwise hold a pipe open after a timeout, and killing the group ends them all.
    with open(stem + ".out", "w") as out, open(stem + ".err", "w") as err:
        p = subprocess.Popen([sys.executable, CHECKS_PY, "--allocator", alloc, "--check", check],
                             stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                             cwd=HERE, start_new_session=True)
        timed_out = False
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(p.pid)  # also after a clean exit: stragglers of the check's children
        if timed_out:
            rc = p.wait()
    wall_s = round(time.monotonic() - t0, 2)
    with open(stem + ".out", errors="replace") as f:
        rec = last_json(f.read())
    base = {"check": check, "allocator": alloc}
    if timed_out:
        # A verdict printed before the hang means the process hung on its way out (an
        # allocator or NCCL teardown, say): still a fail, but say what had been decided.
        said = f" after printing verdict {rec['verdict']!r} (hung at exit)" if rec else ""
        base.update(verdict="fail", detail=f"timed out ({timeout:g} s){said}")
    elif rec is None:
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        base.update(verdict="fail",
                    detail=f"crashed ({how}), no verdict: {_tail(stem + '.err') or 'no stderr'}")
    else:
        base.update(verdict=rec.get("verdict", "fail"), detail=rec.get("detail", ""))
    base.update(wall_s=wall_s, rc=rc)
    if own_tmp is not None:
        own_tmp.cleanup()
    return base


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left of the group


def parse_losses(detail):
    """The list after 'losses=' in train_losses's detail, or None."""
    m = re.search(r"losses=(\[[^\]]*\])", detail or "")
    if not m:
        return None
    try:
        return [float(v) for v in json.loads(m.group(1))]
    except (ValueError, TypeError):
        return None


def compare_losses(got, want):
    """None when got equals want (allclose, rtol 1e-5), else why not."""
    if got is None or want is None:
        return "no losses to compare"
    if len(got) != len(want):
        return f"{len(got)} losses, default has {len(want)}"
    worst = max((abs(a - b) / max(abs(b), 1e-30) for a, b in zip(got, want)), default=0.0)
    if all(abs(a - b) <= LOSS_ATOL + LOSS_RTOL * abs(b) for a, b in zip(got, want)):
        return None
    return f"losses differ from default's (max rel diff {worst:.2e})"


def apply_loss_comparison(records):
    """Marks a berth train_losses pass as a fail when its losses differ from default's."""
    ref = next((r for r in records if r["check"] == "train_losses"
                and r["allocator"] == "default" and r["verdict"] == "pass"), None)
    if ref is None:
        return
    want = parse_losses(ref["detail"])
    for r in records:
        if r["check"] != "train_losses" or r["allocator"] == "default" or r["verdict"] != "pass":
            continue
        why = compare_losses(parse_losses(r["detail"]), want)
        if why:
            r["verdict"], r["detail"] = "fail", f"{why}: {r['detail']}"
        else:
            r["detail"] += " (equal to default's)"


def short(detail, limit=80):
    """The first line of a detail, cut to `limit` characters, safe in a Markdown cell."""
    first = (detail or "").strip().splitlines()[0] if (detail or "").strip() else ""
    first = first.replace("|", "/")
    return first if len(first) <= limit else first[:limit - 3] + "..."


def cell(rec):
    if rec is None:
        return "not run"
    if rec["verdict"] == "pass":
        return "pass"
    if rec["verdict"] == "skip":
        return "skip: " + short(rec["detail"])
    if rec["verdict"] == "refused":
        return "refused: " + short(rec["detail"], 160)
    return "FAIL: " + short(rec["detail"])


def table(records, checks, allocators):
    """The Markdown table, the closing count line, and whether a berth cell failed where
    default passed (a skip, such as berth_torch missing, is not counted as a failure)."""
    by = {(r["check"], r["allocator"]): r for r in records}
    lines = ["| check | " + " | ".join(allocators) + " |",
             "|---" * (len(allocators) + 1) + "|"]
    for c in checks:
        lines.append(f"| {c} | " + " | ".join(cell(by.get((c, a))) for a in allocators) + " |")
    berth = [a for a in allocators if a != "default"]
    where = [(c, a) for c in checks for a in berth
             if by.get((c, "default"), {}).get("verdict") == "pass"]
    n = sum(by.get(k, {}).get("verdict") == "pass" for k in where)
    failed = sum(by.get(k, {}).get("verdict") == "fail" for k in where)
    refused = sum(by.get(k, {}).get("verdict") == "refused" for k in where)
    tail = f"{n} of {len(where)} berth cells pass where default passes"
    if refused:
        tail += f"; {refused} refused by their policy, saying why and what to do instead"
    if "default" not in allocators:
        tail += " (default was not run)"
    return "\n".join(lines), tail, failed > 0


def environment_line():
    """torch, device and berth_torch versions, from a separate process (this one stays free
    of torch and CUDA)."""
    code = ("import importlib.metadata as md, torch\n"
            "dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() "
            "else 'no CUDA device'\n"
            "try: b = 'berth_torch ' + md.version('berth-torch')\n"
            "except Exception: b = 'berth_torch not installed'\n"
            "print(f'torch {torch.__version__} / {dev} / {b}')\n")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
        return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "torch not importable"
    except (subprocess.TimeoutExpired, OSError) as e:
        return f"environment unknown ({e})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "berth-compat"),
                    help="folder for compat.jsonl and logs/ (default %(default)s)")
    ap.add_argument("--allocators", help="comma/space separated (default: env "
                    "BERTH_TORCH_ALLOCATORS, else " + ",".join(ALLOCATORS) + ")")
    ap.add_argument("--checks", help="comma/space separated (default: all)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help="seconds per (check, allocator) process (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        allocators = allocators_from(args.allocators)
    except ValueError as e:
        ap.error(str(e))
    known = list_checks()
    checks = split_names(args.checks) or known
    bad = [c for c in checks if c not in known]
    if bad:
        ap.error(f"unknown check(s) {', '.join(bad)}: use {', '.join(known)}")
    os.makedirs(args.out, exist_ok=True)
    logdir = os.path.join(args.out, "logs")
    records, total, k = [], len(checks) * len(allocators), 0
    for c in checks:
        for a in allocators:
            k += 1
            rec = run_one(c, a, args.timeout, logdir)
            records.append(rec)
            print(f"[{k}/{total}] {c} {a}: {rec['verdict']} ({rec['wall_s']} s) "
                  f"{short(rec['detail'], 100)}", file=sys.stderr, flush=True)
    apply_loss_comparison(records)
    with open(os.path.join(args.out, "compat.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    body, tail, regressed = table(records, checks, allocators)
    print("# berth_torch compatibility\n")
    print(environment_line() + "\n")
    print(body + "\n")
    print(tail)
    return 1 if regressed else 0


if __name__ == "__main__":
    sys.exit(main())
