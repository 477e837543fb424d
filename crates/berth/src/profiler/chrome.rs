//! The Chrome trace of a profile: the JSON object format
//! (<https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU>), which
//! Perfetto and `chrome://tracing` load.
//!
//! Layout:
//! - process 0 (`host`): a track per host thread (tid = profiler thread id) with ops
//!   (`cat: "cpu_op"`), copy calls (`"copy"`), `record_function` ranges
//!   (`"user_annotation"`), allocator events (`"[memory]"` instants, `cat: "memory"`) and
//!   host waits (`cat: "sync"` instants); the host's counter tracks `allocated_bytes` and
//!   `reserved_bytes`.
//! - process `1 + i` (`cuda:i`): a track per CUDA stream (tid 1, 2, ... in order of first
//!   use; its name carries the raw handle) with device spans of ops (`cat: "kernel"`) and
//!   copies (`cat: "gpu_memcpy"`); the device's counter tracks `allocated_bytes` and
//!   `reserved_bytes`.
//!
//! Times (`ts`, `dur`) are microseconds since the profile started. Every span's `args` carry
//! the typed fields of its record, and a host span and its device span share
//! `args.correlation`.

use super::record::{DeviceSpan, MemoryRecord};
use super::{DeviceTimer, Profile};
use crate::Device;
use serde_json::{json, Value};
use std::collections::BTreeMap;

const HOST_PID: u64 = 0;

fn device_pid(device: usize) -> u64 {
    1 + device as u64
}

fn memory_pid(d: Device) -> u64 {
    match d.index() {
        Some(i) if d.is_cuda() => device_pid(usize::from(i)),
        _ => HOST_PID,
    }
}

/// Stream track ids per device: 1, 2, ... in order of first use.
#[derive(Default)]
struct Streams(BTreeMap<(usize, u64), u64>);

impl Streams {
    fn tid(&mut self, span: &DeviceSpan) -> u64 {
        let next = 1 + self.0.keys().filter(|(d, _)| *d == span.device).count() as u64;
        *self.0.entry((span.device, span.stream)).or_insert(next)
    }
}

pub(crate) fn trace(p: &Profile) -> Value {
    let t0 = p.start_ns;
    let us = |ns: u64| ns.saturating_sub(t0) as f64 / 1000.0;
    let dur = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1000.0;
    let r = &p.records;
    let mut ev: Vec<Value> = Vec::new();
    let mut streams = Streams::default();

    for (i, op) in r.ops.iter().enumerate() {
        let args = json!({
            "device": op.device.to_string(),
            "dtype": op.dtype.to_string(),
            "input_shapes": op.input_shapes,
            "output_shape": op.output_shape,
            "bytes_read": op.bytes_read,
            "bytes_written": op.bytes_written,
            "correlation": format!("op:{i}"),
        });
        if p.cpu {
            ev.push(json!({
                "name": op.name, "ph": "X", "cat": "cpu_op", "pid": HOST_PID, "tid": op.thread,
                "ts": us(op.start_ns), "dur": dur(op.start_ns, op.end_ns), "args": args,
            }));
        }
        if let Some(d) = &op.device_span {
            ev.push(json!({
                "name": op.name, "ph": "X", "cat": "kernel", "pid": device_pid(d.device),
                "tid": streams.tid(d), "ts": us(d.start_ns), "dur": dur(d.start_ns, d.end_ns),
                "args": args,
            }));
        }
    }
    for (i, c) in r.copies.iter().enumerate() {
        let name = format!(
            "Memcpy {} ({})",
            c.kind.name(),
            if c.pinned { "pinned" } else { "staged" }
        );
        let args = json!({
            "kind": c.kind.name(),
            "bytes": c.bytes,
            "gbps": c.gbps(),
            "pinned": c.pinned,
            "blocking": c.blocking,
            "device": c.device,
            "stream": format!("{:#x}", c.stream),
            "correlation": format!("copy:{i}"),
        });
        if p.cpu {
            ev.push(json!({
                "name": name, "ph": "X", "cat": "copy", "pid": HOST_PID, "tid": c.thread,
                "ts": us(c.start_ns), "dur": dur(c.start_ns, c.end_ns), "args": args,
            }));
        }
        if let Some(d) = &c.device_span {
            ev.push(json!({
                "name": name, "ph": "X", "cat": "gpu_memcpy", "pid": device_pid(d.device),
                "tid": streams.tid(d), "ts": us(d.start_ns), "dur": dur(d.start_ns, d.end_ns),
                "args": args,
            }));
        }
    }
    if p.cpu {
        for g in &r.ranges {
            ev.push(json!({
                "name": g.name, "ph": "X", "cat": "user_annotation", "pid": HOST_PID,
                "tid": g.thread, "ts": us(g.start_ns), "dur": dur(g.start_ns, g.end_ns),
                "args": {},
            }));
        }
    }
    for s in &r.syncs {
        let what = s.point.unwrap_or("synchronize");
        ev.push(json!({
            "name": format!("sync: {what}"), "ph": "i", "s": "t", "cat": "sync",
            "pid": HOST_PID, "tid": s.thread, "ts": us(s.ts_ns),
            "args": { "point": s.point, "cause": s.cause, "stack": s.stack },
        }));
    }
    for m in &r.memory {
        memory_events(m, us(m.ts_ns), &mut ev);
    }

    let mut meta = vec![json!({
        "name": "process_name", "ph": "M", "pid": HOST_PID, "args": { "name": "host" },
    })];
    for (tid, name) in &p.threads {
        meta.push(json!({
            "name": "thread_name", "ph": "M", "pid": HOST_PID, "tid": tid,
            "args": { "name": name },
        }));
    }
    let mut devices: Vec<usize> = streams.0.keys().map(|(d, _)| *d).collect();
    devices.extend(
        r.memory
            .iter()
            .filter(|m| m.device.is_cuda())
            .filter_map(|m| m.device.index().map(usize::from)),
    );
    devices.sort_unstable();
    devices.dedup();
    for d in devices {
        meta.push(json!({
            "name": "process_name", "ph": "M", "pid": device_pid(d),
            "args": { "name": format!("cuda:{d}") },
        }));
    }
    for ((d, raw), tid) in &streams.0 {
        meta.push(json!({
            "name": "thread_name", "ph": "M", "pid": device_pid(*d), "tid": tid,
            "args": { "name": format!("stream {tid} ({raw:#x})") },
        }));
    }
    meta.append(&mut ev);
    json!({
        "traceEvents": meta,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "berth::profiler", "clock": "us since the profile started",
            "device_timer": p.device_timer().map(DeviceTimer::name),
            "device_timer_fallback": p.device_timer_fallback(),
        },
    })
}

/// The instant and the two counter samples of one allocator event.
fn memory_events(m: &MemoryRecord, ts: f64, ev: &mut Vec<Value>) {
    let pid = memory_pid(m.device);
    ev.push(json!({
        "name": "[memory]", "ph": "i", "s": "t", "cat": "memory", "pid": HOST_PID,
        "tid": m.thread, "ts": ts,
        "args": {
            "device": m.device.to_string(), "action": m.action.name(), "bytes": m.bytes,
            "allocated_bytes": m.allocated_bytes, "reserved_bytes": m.reserved_bytes,
        },
    }));
    for (name, v) in [
        ("allocated_bytes", m.allocated_bytes),
        ("reserved_bytes", m.reserved_bytes),
    ] {
        ev.push(json!({
            "name": name, "ph": "C", "pid": pid, "ts": ts, "args": { "bytes": v },
        }));
    }
}
