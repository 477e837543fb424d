#!/usr/bin/env python3
"""Design-note references that point nowhere.

berth's design notes are written as in PyTorch's c10: a comment line whose text starts with the
word Note and the note's name in square brackets (optionally after a Markdown heading's `# `),
followed by nothing or a colon, defines the note; any other mention of Note and a bracketed name
refers to it. This script collects both over every *.rs, *.md, *.py, *.cpp and *.sh file under
crates/, scripts/ and docs/, and README.md and BENCHMARKS.md (skipping target/, .git and
docs/benchmarks/history.md, the dated benchmark history), and exits 1 listing each reference
whose note is defined nowhere, as file:line and name. A reference right after "PyTorch's" names
one of PyTorch's own notes and is not checked.

A reference may be wrapped over two comment lines (the name broken at a space); names are
compared with their whitespace collapsed. A note defined twice is reported as a warning on
stderr, without failing.

Usage: python3 scripts/ci/note_refs.py   (from anywhere; it scans the repository it lives in)
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIRS = ("crates", "scripts", "docs")
FILES = ("README.md", "BENCHMARKS.md")
EXTENSIONS = (".rs", ".md", ".py", ".cpp", ".sh")
SKIP_DIRS = {"target", ".git"}
SKIP_FILES = {os.path.join("docs", "benchmarks", "history.md")}

# Comment markers, longest first, stripped from the start of a line before it is read.
MARKERS = ("//!", "///", "//", "#")
DEFINITION = re.compile(r"^(?:#+\s*)?Note \[([^\]]+)\]\s*:?\s*$|^(?:#+\s*)?Note \[([^\]]+)\]:")
REFERENCE = re.compile(r"Note\s+\[([^\]]{1,100})\]")
# A reference right after "PyTorch's" names one of PyTorch's own notes (in its source, not here).
EXTERNAL = re.compile(r"PyTorch's\s*`?$")


def files():
    for name in FILES:
        if os.path.isfile(os.path.join(ROOT, name)):
            yield name
    for top in DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for f in sorted(filenames):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
                if f.endswith(EXTENSIONS) and rel not in SKIP_FILES:
                    yield rel


def comment_text(line):
    """The line's text after leading whitespace and one comment marker."""
    s = line.strip()
    for m in MARKERS:
        if s.startswith(m):
            return s[len(m):].strip()
    return s


def normal(name):
    return " ".join(name.split())


def label(name):
    # Built in two parts, so that this file holds no reference itself.
    return "Note" + " [" + name + "]"


def scan(rel):
    """(definitions, references) of one file: lists of (line number, name)."""
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    texts = [comment_text(l) for l in lines]
    defs, refs = [], []
    # The text of all lines joined with spaces, and where each line starts in it, so that a
    # reference wrapped over two lines is found once, at the line where it starts.
    starts, pos = [], 0
    for t in texts:
        starts.append(pos)
        pos += len(t) + 1
    joined = " ".join(texts)
    def_starts = set()
    for i, t in enumerate(texts):
        m = DEFINITION.match(t)
        if m:
            defs.append((i + 1, normal(m.group(1) or m.group(2))))
            def_starts.add(starts[i] + t.find("Note"))
    line = 0
    for m in REFERENCE.finditer(joined):
        if m.start() in def_starts or EXTERNAL.search(joined[max(0, m.start() - 12):m.start()]):
            continue
        while line + 1 < len(starts) and starts[line + 1] <= m.start():
            line += 1
        refs.append((line + 1, normal(m.group(1))))
    return defs, refs


def main():
    defined = {}
    references = []
    for rel in files():
        defs, refs = scan(rel)
        for n, name in defs:
            defined.setdefault(name, []).append(f"{rel}:{n}")
        references += [(rel, n, name) for n, name in refs]
    for name, places in sorted(defined.items()):
        if len(places) > 1:
            print(f"warning: {label(name)} is defined {len(places)} times: {', '.join(places)}",
                  file=sys.stderr)
    dangling = [(rel, n, name) for rel, n, name in references if name not in defined]
    for rel, n, name in dangling:
        print(f"{rel}:{n}: {label(name)} is defined nowhere")
    if dangling:
        print(f"{len(dangling)} reference(s) to notes defined nowhere "
              f"({len(references)} references, {len(defined)} notes)", file=sys.stderr)
        return 1
    print(f"note references: {len(references)}, all defined ({len(defined)} notes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
