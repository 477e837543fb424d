#!/usr/bin/env bash
# The browser check of `berth memviz`: writes the page for a snapshot, renders it in headless
# Chromium, and checks that the page drew its views. The page's script marks the DOM after
# drawing (<body data-timeline="drawn" data-segments="drawn">, and a title ending in
# "[timeline drawn: N blocks]"); --dump-dom reads that back, with the page's hover self-test
# (both views' tooltips name a block). Also checks that the file holds no URL, and writes a
# screenshot.
#
# Usage: scripts/memviz-render.sh [SNAPSHOT] [SCREENSHOT.png]
#   SNAPSHOT    default crates/berth-alloc/tests/data/two_stream_pipeline.snapshot.pickle
#               (PyTorch's own _dump_snapshot of a two-stream pipeline)
#   SCREENSHOT  default target/memviz/memviz.png (docs/memviz.png is this, committed)
#
# Without Chromium (Debian: apt-get install chromium) it prints why and exits 0, unless
# BERTH_REQUIRE_BROWSER=1, where a missing browser fails. BERTH_BROWSER names the browser to use
# (default: the first of chromium, chromium-headless-shell, chromium-browser, google-chrome on
# PATH); BERTH_BIN a built `berth` (default: cargo run -p berth-cli).
set -euo pipefail
cd "$(dirname "$0")/.."

snapshot="${1:-crates/berth-alloc/tests/data/two_stream_pipeline.snapshot.pickle}"
shot="${2:-target/memviz/memviz.png}"

browser=""
for b in ${BERTH_BROWSER:-chromium chromium-headless-shell chromium-browser google-chrome}; do
    if command -v "$b" >/dev/null 2>&1; then
        browser="$b"
        break
    fi
done
if [ -z "$browser" ]; then
    msg="memviz-render: skipped: no Chromium found (looked for: ${BERTH_BROWSER:-chromium chromium-headless-shell chromium-browser google-chrome}); on Debian: apt-get install chromium"
    if [ "${BERTH_REQUIRE_BROWSER:-0}" = 1 ]; then
        echo "$msg; BERTH_REQUIRE_BROWSER=1, so this fails" >&2
        exit 1
    fi
    echo "$msg"
    exit 0
fi

work="target/memviz"
mkdir -p "$work" "$(dirname "$shot")"
html="$(pwd)/$work/$(basename "$snapshot").html"
if [ -n "${BERTH_BIN:-}" ]; then
    "$BERTH_BIN" memviz "$snapshot" -o "$html"
else
    cargo run --quiet -p berth-cli -- memviz "$snapshot" -o "$html"
fi

if grep -Eq 'https?://' "$html"; then
    echo "memviz-render: FAIL: $html holds a URL:" >&2
    grep -Eo 'https?://[^"'"'"' )]*' "$html" | sort -u | head -5 >&2
    exit 1
fi

# A fresh profile each run; --no-sandbox because CI runs as root (the page is our own file).
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run
    --user-data-dir="$profile" --window-size=1400,980 --virtual-time-budget=10000)
url="file://$html"

# `#selftest` makes the page also hover once over its largest block and its first segment and
# record both tooltips' first lines in <body data-timeline-hover=... data-segment-hover=...>.
dom="$("$browser" "${flags[@]}" --dump-dom "$url#selftest" 2>/dev/null)"
# Here-strings, not pipes: `grep -q` stops reading early, which fails a pipe under pipefail.
title="$(grep -o '<title>[^<]*</title>' <<<"$dom" | head -1 || true)"
if ! grep -q 'data-timeline="drawn"' <<<"$dom" \
    || ! grep -q 'data-segments="drawn"' <<<"$dom" \
    || ! grep -q 'timeline drawn: [0-9]* blocks' <<<"$title"; then
    echo "memviz-render: FAIL: the page did not mark its views drawn (title: ${title:-none})" >&2
    exit 1
fi
hover="$(grep -o 'data-timeline-hover="[^"]*"' <<<"$dom" || true)"
seg_hover="$(grep -o 'data-segment-hover="[^"]*"' <<<"$dom" || true)"
if ! grep -q 'data-timeline-hover="block 0x' <<<"$hover" \
    || ! grep -Eq 'data-segment-hover="(block|[0-9]+ blocks from) 0x' <<<"$seg_hover"; then
    echo "memviz-render: FAIL: hovering did not show a block (${hover:-no timeline tooltip}; ${seg_hover:-no segment tooltip})" >&2
    exit 1
fi

rm -f "$shot"
"$browser" "${flags[@]}" --screenshot="$(cd "$(dirname "$shot")" && pwd)/$(basename "$shot")" "$url" >/dev/null 2>&1
if [ ! -s "$shot" ]; then
    echo "memviz-render: FAIL: $browser wrote no screenshot to $shot" >&2
    exit 1
fi
echo "memviz-render: ok: $("$browser" --version 2>/dev/null | head -1) drew $html ${title}"
echo "   $(grep -o 'data-timeline-ms="[^"]*"' <<<"$dom" || true) (one draw of the timeline)"
echo "   hover: ${hover}; ${seg_hover}"
echo "   screenshot: $shot"
