#!/usr/bin/env python3
"""Lists the file-level `crate::` import edges of each workspace crate and fails on a cycle.

usage: python3 scripts/ci/import_loops.py [--edges]

A file `a.rs` (module `a`) imports module `b` when it names `crate::b`, or `super::b` / `self::b`
resolved from `a`, in a `use` or a path (doc links are not counted: doc comments and plain
comments are skipped). Modules are files: `mod.rs`
stands for its directory, and an edge to `crate::x::y` goes to the file of `x::y` when there is
one, else to `x`. An edge from a file to a module that contains it (a child naming its parent's
items) counts as an edge to the parent's own file only. A cycle is a strongly connected set of
two or more files; each is printed with its edges, and the exit status is 1 when there is one.
House style, "One home per concept": interfaces are leaves, no file import loops inside a crate.
"""
import os, re, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PATH = re.compile(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*|\{)")
USE_GROUP = re.compile(r"\buse\s+crate::\{([^;]*)\};", re.S)


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return "\n".join(re.sub(r"//.*", "", line) for line in src.splitlines())


def modules(src_dir):
    """module path (tuple) -> file, for every .rs file under src_dir."""
    mods = {}
    for dirpath, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src_dir)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            mods[tuple(parts)] = os.path.join(dirpath, f)
    return mods


def resolve(mods, path):
    """The longest prefix of `path` that is a module file."""
    for k in range(len(path), 0, -1):
        if tuple(path[:k]) in mods:
            return tuple(path[:k])
    return None


SUPER = re.compile(r"\b(self|super)((?:::super)*)::(?=[a-z_{])")


def absolute(m, src):
    """Rewrites `self::` and `super::` paths of module `m` as `crate::` paths, so a sibling named
    through `super::` is an edge like any other. `use super::*` (the glob of a file's inline
    test module, whose `super` is the file itself) is removed before."""
    def sub(match):
        up = (1 if match.group(1) == "super" else 0) + match.group(2).count("super")
        base = m[: max(len(m) - up, 0)]
        return "crate::" + "".join(x + "::" for x in base) if base else "crate::"
    return SUPER.sub(sub, src)


def edges_of(mods):
    edges = {m: set() for m in mods}
    for m, f in mods.items():
        src = strip_comments(open(f, encoding="utf-8").read())
        src = re.sub(r"\buse\s+super::\*\s*;", "", src)
        src = absolute(m, src)
        paths = []
        for g in USE_GROUP.finditer(src):
            for item in re.split(r"[,\s]+", re.sub(r"\{[^{}]*\}", "", g.group(1))):
                if item:
                    paths.append(item.split("::"))
            # nested groups: a::{b, c} -> a::b, a::c
            for inner in re.finditer(r"([a-z_][a-z0-9_:]*)::\{([^{}]*)\}", g.group(1)):
                for item in re.split(r"[,\s]+", inner.group(2)):
                    if item and item != "self":
                        paths.append(inner.group(1).split("::") + item.split("::"))
        for p in PATH.finditer(src):
            if p.group(1) != "{":
                paths.append(p.group(1).split("::"))
        for p in paths:
            t = resolve(mods, [x for x in p if x])
            if t is None or t == m or t == ():
                continue
            edges[m].add(t)
    return edges


def sccs(edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def name(m):
    return "::".join(m) or "lib"


def main():
    show = "--edges" in sys.argv
    crates = os.path.join(ROOT, "crates")
    loops = 0
    for c in sorted(os.listdir(crates)):
        src = os.path.join(crates, c, "src")
        if not os.path.isdir(src):
            continue
        mods = modules(src)
        edges = edges_of(mods)
        if show:
            for m in sorted(edges):
                print(f"{c}: {name(m)} -> {', '.join(sorted(name(t) for t in edges[m])) or '-'}")
        for comp in sccs(edges):
            loops += 1
            members = set(comp)
            print(f"{c}: import loop of {len(comp)} files: {', '.join(sorted(name(m) for m in comp))}")
            for m in sorted(comp):
                inside = sorted(name(t) for t in edges[m] if t in members)
                print(f"    {name(m)} -> {', '.join(inside)}")
    print(f"{loops} import loop(s)")
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main())
