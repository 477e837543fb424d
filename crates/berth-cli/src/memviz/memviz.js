// berth memviz: draws the data embedded in #memviz-data (computed by `berth memviz`) on two
// canvases. Plain JavaScript, no libraries, nothing loaded from anywhere.
(function () {
  'use strict';

  const D = JSON.parse(document.getElementById('memviz-data').textContent);
  const T = D.timeline;
  const C = T.columns;
  const nCols = C.step.length;
  // Tableau-like colours for blocks; grey is kept for what is not drawn one by one.
  const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f',
    '#edc948', '#b07aa1', '#ff9da7', '#9c755f'];
  const GREY = '#cfcfcf';
  const STATE_NAMES = ['active_allocated', 'active_pending_free', 'inactive', 'merged'];
  const tooltip = document.getElementById('tooltip');

  function fmtBytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let v = n;
    let u = 0;
    while (Math.abs(v) >= 1024 && u < units.length - 1) {
      v /= 1024;
      u += 1;
    }
    return u === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${units[u]}`;
  }

  function fmtUs(us) {
    if (us === null || us === undefined) {
      return '-';
    }
    return `${((us - T.start_us) / 1000).toFixed(3)} ms`;
  }

  function showTip(ev, text) {
    tooltip.textContent = text;
    tooltip.hidden = false;
    const pad = 14;
    const w = tooltip.offsetWidth;
    const h = tooltip.offsetHeight;
    let x = ev.clientX + pad;
    let y = ev.clientY + pad;
    if (x + w > window.innerWidth) x = Math.max(0, ev.clientX - pad - w);
    if (y + h > window.innerHeight) y = Math.max(0, ev.clientY - pad - h);
    tooltip.style.left = `${x}px`;
    tooltip.style.top = `${y}px`;
  }

  function hideTip() {
    tooltip.hidden = true;
  }

  // Sizes a canvas to CSS pixels, drawing at the device's pixel ratio.
  function sizeCanvas(canvas, w, h) {
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.max(1, Math.round(w * dpr));
    canvas.height = Math.max(1, Math.round(h * dpr));
    canvas.style.width = `${w}px`;
    canvas.style.height = `${h}px`;
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  // A tick step near span / 5 in 1, 2, 5 × 1024^k bytes.
  function byteStep(span) {
    let unit = 1;
    while (span / unit >= 1024) unit *= 1024;
    const target = span / unit / 5;
    for (const m of [1, 2, 5, 10, 20, 50, 100, 200, 500]) {
      if (m >= target) return m * unit;
    }
    return 1024 * unit;
  }

  document.getElementById('title').textContent = `berth memviz: ${D.title}`;
  document.getElementById('summary').textContent =
    `device ${D.device}` + (D.devices.length > 1 ? ` (of ${D.devices.join(', ')})` : '') +
    ` · ${D.counts.segments} segments · ${D.counts.blocks} blocks` +
    ` · ${D.counts.trace_entries} trace entries · reserved ${fmtBytes(D.reserved_bytes)}` +
    ` · allocated ${fmtBytes(D.allocated_bytes)} · peak allocated in the trace ` +
    `${fmtBytes(T.peak_bytes)} · peak reserved ${fmtBytes(T.peak_reserved_bytes)}`;

  // ---------------------------------------------------------------- timeline
  const tl = {
    plot: document.getElementById('timeline-plot'),
    canvas: document.getElementById('timeline'),
    hl: document.getElementById('timeline-hl'),
    v0: 0,
    v1: nCols,
    padL: 78,
    padR: 12,
    padT: 10,
    padB: 34,
    w: 0,
    h: 0,
    ymax: 1,
    ctx: null,
    hctx: null,
    drag: null,
  };

  function plotW() {
    return tl.w - tl.padL - tl.padR;
  }

  function plotH() {
    return tl.h - tl.padT - tl.padB;
  }

  function xOf(col) {
    return tl.padL + (col - tl.v0) / (tl.v1 - tl.v0) * plotW();
  }

  function yOf(bytes) {
    return tl.padT + plotH() - bytes / tl.ymax * plotH();
  }

  // The band's bottom offset at column `col` (its points are [col, offset, ...], sorted).
  function offsetAt(b, col) {
    const p = b.points;
    let lo = 0;
    let hi = p.length / 2 - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (p[2 * mid] <= col) lo = mid; else hi = mid - 1;
    }
    return p[2 * lo + 1];
  }

  function bandPath(ctx, b) {
    const p = b.points;
    const n = p.length / 2;
    ctx.beginPath();
    for (let k = 0; k < n; k++) {
      const xs = xOf(p[2 * k]);
      const xe = xOf(k + 1 < n ? p[2 * k + 2] : b.x1);
      const y = yOf(p[2 * k + 1]);
      if (k === 0) ctx.moveTo(xs, y); else ctx.lineTo(xs, y);
      ctx.lineTo(xe, y);
    }
    for (let k = n - 1; k >= 0; k--) {
      const xs = xOf(p[2 * k]);
      const xe = xOf(k + 1 < n ? p[2 * k + 2] : b.x1);
      const y = yOf(p[2 * k + 1] + b.size);
      ctx.lineTo(xe, y);
      ctx.lineTo(xs, y);
    }
    ctx.closePath();
  }

  function stepLine(ctx, values, c0, c1) {
    ctx.beginPath();
    for (let c = c0; c < c1; c++) {
      const y = yOf(values[c]);
      if (c === c0) ctx.moveTo(xOf(c), y); else ctx.lineTo(xOf(c), y);
      ctx.lineTo(xOf(c + 1), y);
    }
  }

  function drawTimeline() {
    const started = performance.now();
    tl.w = Math.max(320, tl.plot.clientWidth);
    tl.h = tl.plot.clientHeight || 420;
    tl.ctx = sizeCanvas(tl.canvas, tl.w, tl.h);
    tl.hctx = sizeCanvas(tl.hl, tl.w, tl.h);
    const ctx = tl.ctx;
    const c0 = Math.max(0, Math.floor(tl.v0));
    const c1 = Math.min(nCols, Math.ceil(tl.v1));
    let ymax = 1;
    for (let c = c0; c < c1; c++) {
      ymax = Math.max(ymax, C.alloc_max[c], C.reserved_max[c]);
    }
    tl.ymax = ymax * 1.05;

    ctx.clearRect(0, 0, tl.w, tl.h);
    ctx.save();
    ctx.beginPath();
    ctx.rect(tl.padL, tl.padT, plotW(), plotH());
    ctx.clip();
    // The grey area: the highest allocated bytes of each column.
    ctx.beginPath();
    ctx.moveTo(xOf(c0), yOf(0));
    for (let c = c0; c < c1; c++) {
      const y = yOf(C.alloc_max[c]);
      ctx.lineTo(xOf(c), y);
      ctx.lineTo(xOf(c + 1), y);
    }
    ctx.lineTo(xOf(c1), yOf(0));
    ctx.closePath();
    ctx.fillStyle = GREY;
    ctx.fill();
    // The blocks drawn one by one.
    let drawn = 0;
    T.bands.forEach((b, i) => {
      if (b.x1 <= tl.v0 || b.x0 >= tl.v1) return;
      bandPath(ctx, b);
      ctx.fillStyle = PALETTE[i % PALETTE.length];
      ctx.fill();
      drawn += 1;
    });
    // Reserved bytes.
    ctx.setLineDash([5, 3]);
    ctx.strokeStyle = '#333';
    ctx.lineWidth = 1.25;
    stepLine(ctx, C.reserved_max, c0, c1);
    ctx.stroke();
    ctx.setLineDash([]);
    // Out-of-memory markers.
    ctx.strokeStyle = '#d62728';
    ctx.lineWidth = 2;
    for (const c of T.oom_columns) {
      if (c + 1 < tl.v0 || c > tl.v1) continue;
      const x = xOf(c + 0.5);
      ctx.beginPath();
      ctx.moveTo(x, tl.padT);
      ctx.lineTo(x, tl.padT + plotH());
      ctx.stroke();
    }
    ctx.restore();
    drawTimelineAxes(ctx);
    document.body.dataset.timeline = 'drawn';
    document.body.dataset.timelineBands = String(drawn);
    document.body.dataset.timelineMs = (performance.now() - started).toFixed(1);
    document.title = `berth memviz: ${D.title} [timeline drawn: ${drawn} blocks]`;
  }

  function drawTimelineAxes(ctx) {
    ctx.strokeStyle = '#444';
    ctx.fillStyle = '#333';
    ctx.lineWidth = 1;
    ctx.font = '11px system-ui, sans-serif';
    ctx.beginPath();
    ctx.moveTo(tl.padL, tl.padT);
    ctx.lineTo(tl.padL, tl.padT + plotH());
    ctx.lineTo(tl.padL + plotW(), tl.padT + plotH());
    ctx.stroke();
    const step = byteStep(tl.ymax);
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (let v = 0; v <= tl.ymax; v += step) {
      const y = yOf(v);
      ctx.beginPath();
      ctx.moveTo(tl.padL - 4, y);
      ctx.lineTo(tl.padL, y);
      ctx.stroke();
      ctx.fillText(fmtBytes(v), tl.padL - 6, y);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const ticks = Math.max(2, Math.floor(plotW() / 140));
    for (let i = 0; i <= ticks; i++) {
      const col = tl.v0 + (tl.v1 - tl.v0) * i / ticks;
      const c = Math.min(nCols - 1, Math.max(0, Math.floor(col)));
      const x = xOf(col);
      ctx.beginPath();
      ctx.moveTo(x, tl.padT + plotH());
      ctx.lineTo(x, tl.padT + plotH() + 4);
      ctx.stroke();
      ctx.textAlign = i === 0 ? 'left' : i === ticks ? 'right' : 'center';
      ctx.fillText(fmtUs(C.t0_us[c]), x, tl.padT + plotH() + 6);
    }
    ctx.textAlign = 'center';
    ctx.fillText('time since the first trace entry (one column per step group)',
      tl.padL + plotW() / 2, tl.padT + plotH() + 20);
  }

  function timelineColumn(mx) {
    const col = Math.floor(tl.v0 + (mx - tl.padL) / plotW() * (tl.v1 - tl.v0));
    return Math.min(nCols - 1, Math.max(0, col));
  }

  function timelineHover(ev) {
    const r = tl.hl.getBoundingClientRect();
    const mx = ev.clientX - r.left;
    const my = ev.clientY - r.top;
    tl.hctx.clearRect(0, 0, tl.w, tl.h);
    if (mx < tl.padL || mx > tl.padL + plotW() || my < tl.padT || my > tl.padT + plotH()) {
      hideTip();
      return;
    }
    const col = timelineColumn(mx);
    const bytes = (tl.padT + plotH() - my) / plotH() * tl.ymax;
    // The block under the pointer, or else the nearest within 2 pixels (thin blocks).
    let hit = null;
    let best = 2 * tl.ymax / plotH();
    for (const b of T.bands) {
      if (b.x0 > col || b.x1 <= col) continue;
      const off = offsetAt(b, col);
      const d = bytes < off ? off - bytes : bytes >= off + b.size ? bytes - off - b.size : -1;
      if (d < best) {
        hit = b;
        best = d;
        if (d < 0) break;
      }
    }
    const lines = [];
    if (hit) {
      lines.push(`block ${hit.addr}  ${fmtBytes(hit.size)} (${hit.size} bytes)  stream ${hit.stream}`);
      lines.push(`allocated       ${hit.alloc_us === null ? 'before the trace' : fmtUs(hit.alloc_us)}`);
      if (hit.free_requested_us !== null) {
        lines.push(`free requested  ${fmtUs(hit.free_requested_us)}`);
      }
      lines.push(`freed           ${hit.free_us === null ? 'no (live at the snapshot)' : fmtUs(hit.free_us)}`);
      tl.hctx.strokeStyle = '#000';
      tl.hctx.lineWidth = 1.5;
      bandPath(tl.hctx, hit);
      tl.hctx.stroke();
    } else if (bytes <= C.alloc_max[col]) {
      lines.push('blocks too small (or too many) to draw one by one');
    }
    const t0 = C.t0_us[col];
    const t1 = C.t1_us[col];
    lines.push(`step ${C.step[col]}  at ${fmtUs(t0)}${t1 !== t0 ? ` .. ${fmtUs(t1)}` : ''}`);
    lines.push(`allocated ${fmtBytes(C.alloc_end[col])} (column peak ${fmtBytes(C.alloc_max[col])}), ` +
      `${C.live[col]} live blocks, reserved ${fmtBytes(C.reserved_max[col])}`);
    showTip(ev, lines.join('\n'));
  }

  // Redraws at most once per frame while zooming or panning.
  let drawQueued = false;
  function queueDraw() {
    if (drawQueued) return;
    drawQueued = true;
    window.requestAnimationFrame(() => {
      drawQueued = false;
      drawTimeline();
    });
  }

  function zoomTimeline(ev) {
    ev.preventDefault();
    const r = tl.hl.getBoundingClientRect();
    const span = tl.v1 - tl.v0;
    const at = tl.v0 + (ev.clientX - r.left - tl.padL) / plotW() * span;
    const span2 = Math.min(nCols, Math.max(Math.min(nCols, 4), span * Math.exp(ev.deltaY * 0.002)));
    let v0 = at - (at - tl.v0) * span2 / span;
    v0 = Math.min(Math.max(0, v0), nCols - span2);
    tl.v0 = v0;
    tl.v1 = v0 + span2;
    queueDraw();
  }

  tl.hl.addEventListener('mousemove', (ev) => {
    if (tl.drag) {
      const span = tl.v1 - tl.v0;
      const d = (ev.clientX - tl.drag.x) / plotW() * span;
      const v0 = Math.min(Math.max(0, tl.drag.v0 - d), nCols - span);
      tl.v0 = v0;
      tl.v1 = v0 + span;
      queueDraw();
      hideTip();
      return;
    }
    timelineHover(ev);
  });
  tl.hl.addEventListener('mouseleave', () => {
    tl.drag = null;
    tl.hctx.clearRect(0, 0, tl.w, tl.h);
    hideTip();
  });
  tl.hl.addEventListener('mousedown', (ev) => {
    tl.drag = { x: ev.clientX, v0: tl.v0 };
  });
  window.addEventListener('mouseup', () => {
    tl.drag = null;
  });
  tl.hl.addEventListener('wheel', zoomTimeline, { passive: false });
  tl.hl.addEventListener('dblclick', () => {
    tl.v0 = 0;
    tl.v1 = nCols;
    drawTimeline();
  });

  const note = [];
  if (D.counts.trace_entries === 0) {
    note.push('The snapshot holds no trace entries (history was not recorded): the timeline ' +
      'shows the blocks live at the snapshot as one step.');
  }
  note.push(`${T.steps} steps in ${nCols} columns; ${T.bands.length} of ${T.blocks} blocks drawn ` +
    `one by one (${T.visible_blocks} at least 1/1024 of the peak tall); the rest is grey.`);
  document.getElementById('timeline-note').textContent = note.join(' ');

  // ---------------------------------------------------------------- segments
  const ROW_H = 18;
  const LABEL_W = 250;
  const seg = {
    scroll: document.getElementById('segment-scroll'),
    spacer: document.getElementById('segment-spacer'),
    canvas: document.getElementById('segments'),
    w: 0,
    h: 0,
  };
  const rows = D.segments;
  seg.spacer.style.height = `${Math.max(1, rows.length) * ROW_H}px`;

  function barGeometry() {
    return { x0: LABEL_W, w: Math.max(40, seg.w - LABEL_W - 10) };
  }

  function drawSegments() {
    seg.w = Math.max(360, seg.scroll.clientWidth);
    seg.h = Math.min(Math.max(1, rows.length) * ROW_H, seg.scroll.clientHeight || 480);
    const ctx = sizeCanvas(seg.canvas, seg.w, seg.h);
    const top = seg.scroll.scrollTop;
    const first = Math.floor(top / ROW_H);
    const last = Math.min(rows.length, Math.ceil((top + seg.h) / ROW_H));
    const { x0, w } = barGeometry();
    ctx.clearRect(0, 0, seg.w, seg.h);
    ctx.font = '11px ui-monospace, SFMono-Regular, Menlo, monospace';
    ctx.textBaseline = 'middle';
    if (rows.length === 0) {
      ctx.fillStyle = '#555';
      ctx.fillText('no segments on this device', 8, ROW_H / 2);
    }
    for (let r = first; r < last; r++) {
      const s = rows[r];
      const y = r * ROW_H - top;
      ctx.fillStyle = '#333';
      ctx.fillText(`${s.addr} ${fmtBytes(s.size)}`, 6, y + ROW_H / 2);
      for (const [off, size, req, state] of s.blocks) {
        const bx = x0 + off / s.size * w;
        const bw = Math.max(1, size / s.size * w);
        if (state === 0) {
          ctx.fillStyle = '#a0cbe8';
          ctx.fillRect(bx, y + 2, bw, ROW_H - 4);
          ctx.fillStyle = '#4e79a7';
          ctx.fillRect(bx, y + 2, Math.max(1, Math.min(1, req / size) * bw), ROW_H - 4);
        } else {
          ctx.fillStyle = state === 1 ? '#f28e2b' : state === 2 ? '#ececec' : '#8c6bb1';
          ctx.fillRect(bx, y + 2, bw, ROW_H - 4);
        }
        if (bw >= 4) {
          ctx.fillStyle = '#fff';
          ctx.fillRect(bx, y + 2, 1, ROW_H - 4);
        }
      }
    }
    document.body.dataset.segments = 'drawn';
  }

  function segmentHover(ev) {
    const r = seg.canvas.getBoundingClientRect();
    const mx = ev.clientX - r.left;
    const my = ev.clientY - r.top;
    const row = Math.floor((my + seg.scroll.scrollTop) / ROW_H);
    const s = rows[row];
    const { x0, w } = barGeometry();
    if (!s) {
      hideTip();
      return;
    }
    const lines = [];
    if (mx >= x0 && mx <= x0 + w) {
      const at = (mx - x0) / w * s.size;
      let lo = 0;
      let hi = s.blocks.length - 1;
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (s.blocks[mid][0] <= at) lo = mid; else hi = mid - 1;
      }
      const [off, size, req, state, count] = s.blocks[lo];
      const addr = `0x${(BigInt(s.addr) + BigInt(off)).toString(16)}`;
      if (state === 3) {
        lines.push(`${count} blocks from ${addr}, merged (each under a pixel wide)`);
        lines.push(`${fmtBytes(size)} (${size} bytes), ${fmtBytes(req)} of it allocated`);
      } else {
        lines.push(`block ${addr}  ${fmtBytes(size)} (${size} bytes)`);
        lines.push(`requested ${fmtBytes(req)} (${req} bytes)`);
        lines.push(`state ${STATE_NAMES[state]}`);
      }
    }
    const pool = s.pool[0] === '0' && s.pool[1] === '0' ? '' : `  pool (${s.pool[0]}, ${s.pool[1]})`;
    lines.push(`segment ${s.addr}  ${fmtBytes(s.size)}  ${s.kind} pool  stream ${s.stream}` +
      `${s.expandable ? '  expandable' : ''}${pool}`);
    lines.push(`${s.block_count} blocks, allocated ${fmtBytes(s.allocated)}, ` +
      `active ${fmtBytes(s.active)}, requested ${fmtBytes(s.requested)}`);
    showTip(ev, lines.join('\n'));
  }

  seg.scroll.addEventListener('scroll', drawSegments);
  seg.canvas.addEventListener('mousemove', segmentHover);
  seg.canvas.addEventListener('mouseleave', hideTip);
  const merged = rows.reduce((n, s) => n + s.blocks.filter((b) => b[3] === 3).length, 0);
  document.getElementById('segment-note').textContent =
    `${rows.length} segments, ${D.counts.blocks} blocks` +
    (merged > 0 ? `; ${merged} runs of blocks under a pixel wide are merged.` : '.');

  let resizeTimer = null;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      drawTimeline();
      drawSegments();
    }, 100);
  });
  drawTimeline();
  drawSegments();

  // With `#selftest` in the URL (scripts/memviz-render.sh), hover once over the drawn block
  // covering the most pixels and once over the first segment, and record the tooltips in the
  // DOM, so a headless browser can check that hovering works.
  if (window.location.hash === '#selftest') {
    const r = tl.hl.getBoundingClientRect();
    let big = null;
    const area = (b) => (b.x1 - b.x0) * b.size;
    for (const b of T.bands) {
      if (big === null || area(b) > area(big)) big = b;
    }
    if (big !== null) {
      const col = Math.floor((big.x0 + big.x1 - 1) / 2);
      tl.hl.dispatchEvent(new MouseEvent('mousemove', {
        clientX: r.left + xOf(col + 0.5),
        clientY: r.top + yOf(offsetAt(big, col) + big.size / 2),
      }));
      document.body.dataset.timelineHover = tooltip.textContent.split('\n')[0];
    }
    if (rows.length > 0) {
      const sr = seg.canvas.getBoundingClientRect();
      const { x0, w } = barGeometry();
      seg.canvas.dispatchEvent(new MouseEvent('mousemove', {
        clientX: sr.left + x0 + w / 2,
        clientY: sr.top + ROW_H / 2,
      }));
      document.body.dataset.segmentHover = tooltip.textContent.split('\n')[0];
    }
    hideTip();
  }
}());
