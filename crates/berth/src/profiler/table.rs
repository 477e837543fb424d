//! `key_averages()`: statistics per op name, copy kind and range name, and their table, as
//! `prof.key_averages().table(sort_by=..., row_limit=...)`
//! (<https://docs.pytorch.org/docs/stable/profiler.html#torch.profiler._KinetoProfile.key_averages>).
//!
//! Self time is a row's time minus the time of the records directly inside it on the same
//! thread (an op inside a `record_function` range, a copy inside a `to` op).

use super::record::Records;
use std::collections::HashMap;
use std::fmt;

/// The statistics of one key (an op name such as `matmul`, a copy such as `Memcpy HtoD`, or
/// a `record_function` name).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyAverage {
    /// The key.
    pub key: String,
    /// Calls (COUNT).
    pub calls: u64,
    /// Host time, children included, in nanoseconds (SUM).
    pub cpu_total_ns: u64,
    /// Host time less the records directly inside, in nanoseconds (SUM).
    pub self_cpu_ns: u64,
    /// Device time, in nanoseconds (SUM; 0 without device spans).
    pub device_total_ns: u64,
    /// Device time of the key itself, in nanoseconds (SUM; device spans do not nest, so it
    /// equals `device_total_ns` for ops and copies, and is 0 for ranges).
    pub self_device_ns: u64,
    /// Bytes read and written by ops, or copied by copies (SUM).
    pub bytes: u64,
}

/// The column to sort a [`KeyAverages::table`] by (descending).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SortBy {
    /// `cpu_time_total`.
    CpuTotal,
    /// `self_cpu_time_total`.
    SelfCpu,
    /// `cuda_time_total` / `device_time_total`.
    DeviceTotal,
    /// `self_cuda_time_total` / `self_device_time_total`.
    SelfDevice,
    /// `count`.
    Calls,
    /// Bytes.
    Bytes,
}

/// The rows of `key_averages()`, in order of first appearance.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyAverages {
    /// One row per key.
    pub rows: Vec<KeyAverage>,
}

impl KeyAverages {
    /// The row of `key`, if it was recorded.
    pub fn get(&self, key: &str) -> Option<&KeyAverage> {
        self.rows.iter().find(|r| r.key == key)
    }

    /// The rows sorted by `sort_by` (largest first), at most `row_limit`, as a text table
    /// with a totals line (times in `us`, `ms` or `s`; bytes in IEC units, `MiB`).
    pub fn table(&self, sort_by: SortBy, row_limit: usize) -> String {
        let mut rows: Vec<&KeyAverage> = self.rows.iter().collect();
        let k = |r: &KeyAverage| match sort_by {
            SortBy::CpuTotal => r.cpu_total_ns,
            SortBy::SelfCpu => r.self_cpu_ns,
            SortBy::DeviceTotal => r.device_total_ns,
            SortBy::SelfDevice => r.self_device_ns,
            SortBy::Calls => r.calls,
            SortBy::Bytes => r.bytes,
        };
        rows.sort_by(|a, b| k(b).cmp(&k(a)).then_with(|| a.key.cmp(&b.key)));
        rows.truncate(row_limit);
        let name_w = rows
            .iter()
            .map(|r| r.key.len())
            .max()
            .unwrap_or(4)
            .clamp(4, 40);
        let heads = [
            "Self CPU %",
            "Self CPU",
            "CPU total",
            "CPU time avg",
            "Self Device",
            "Device total",
            "# of Calls",
            "Bytes",
        ];
        let mut out = String::new();
        let line = "-".repeat(name_w + heads.iter().map(|h| h.len().max(12) + 2).sum::<usize>());
        out.push_str(&line);
        out.push('\n');
        out.push_str(&format!("{:<name_w$}", "Name"));
        for h in heads {
            out.push_str(&format!("  {h:>12}"));
        }
        out.push('\n');
        out.push_str(&line);
        out.push('\n');
        let self_total: u64 = self.rows.iter().map(|r| r.self_cpu_ns).sum();
        for r in &rows {
            let name: String = r.key.chars().take(name_w).collect();
            let pct = if self_total > 0 {
                100.0 * r.self_cpu_ns as f64 / self_total as f64
            } else {
                0.0
            };
            let cells = [
                format!("{pct:.2}%"),
                time(r.self_cpu_ns),
                time(r.cpu_total_ns),
                time(r.cpu_total_ns / r.calls.max(1)),
                time(r.self_device_ns),
                time(r.device_total_ns),
                r.calls.to_string(),
                berth_alloc::stats::format_size(r.bytes),
            ];
            out.push_str(&format!("{name:<name_w$}"));
            for c in cells {
                out.push_str(&format!("  {c:>12}"));
            }
            out.push('\n');
        }
        out.push_str(&line);
        out.push('\n');
        let device_total: u64 = self.rows.iter().map(|r| r.self_device_ns).sum();
        out.push_str(&format!(
            "Self CPU time total: {}\nSelf Device time total: {}\n",
            time(self_total),
            time(device_total)
        ));
        out
    }
}

impl fmt::Display for KeyAverages {
    /// The whole table sorted by CPU total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table(SortBy::CpuTotal, usize::MAX))
    }
}

/// `ns` as `12.345us`, `1.234ms` or `1.234s`.
fn time(ns: u64) -> String {
    let ns = ns as f64;
    if ns < 1e6 {
        format!("{:.3}us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.3}ms", ns / 1e6)
    } else {
        format!("{:.3}s", ns / 1e9)
    }
}

/// One host interval of a row, for self times.
struct Interval {
    thread: u64,
    start: u64,
    end: u64,
    row: usize,
}

pub(crate) fn key_averages(r: &Records) -> KeyAverages {
    let mut rows: Vec<KeyAverage> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut row_of = |key: String, rows: &mut Vec<KeyAverage>| -> usize {
        *index.entry(key.clone()).or_insert_with(|| {
            rows.push(KeyAverage {
                key,
                ..KeyAverage::default()
            });
            rows.len() - 1
        })
    };
    let mut intervals = Vec::new();
    for op in &r.ops {
        let i = row_of(op.name.to_owned(), &mut rows);
        let d = op.device_span.map_or(0, |s| s.dur_ns());
        let row = &mut rows[i];
        row.calls += 1;
        row.device_total_ns += d;
        row.self_device_ns += d;
        row.bytes += op.bytes_read + op.bytes_written;
        intervals.push(Interval {
            thread: op.thread,
            start: op.start_ns,
            end: op.end_ns,
            row: i,
        });
    }
    for c in &r.copies {
        let i = row_of(format!("Memcpy {}", c.kind.name()), &mut rows);
        let d = c.device_span.map_or(0, |s| s.dur_ns());
        let row = &mut rows[i];
        row.calls += 1;
        row.device_total_ns += d;
        row.self_device_ns += d;
        row.bytes += c.bytes;
        intervals.push(Interval {
            thread: c.thread,
            start: c.start_ns,
            end: c.end_ns,
            row: i,
        });
    }
    for g in &r.ranges {
        let i = row_of(g.name.clone(), &mut rows);
        rows[i].calls += 1;
        intervals.push(Interval {
            thread: g.thread,
            start: g.start_ns,
            end: g.end_ns,
            row: i,
        });
    }
    // Parents first: by thread, start, then the longer one.
    intervals.sort_by(|a, b| {
        (a.thread, a.start, std::cmp::Reverse(a.end)).cmp(&(
            b.thread,
            b.start,
            std::cmp::Reverse(b.end),
        ))
    });
    let mut child_ns = vec![0u64; intervals.len()];
    let mut stack: Vec<usize> = Vec::new();
    for (k, iv) in intervals.iter().enumerate() {
        while let Some(&top) = stack.last() {
            let t = &intervals[top];
            if t.thread == iv.thread && iv.start >= t.start && iv.end <= t.end {
                break;
            }
            stack.pop();
        }
        if let Some(&top) = stack.last() {
            child_ns[top] += iv.end.saturating_sub(iv.start);
        }
        stack.push(k);
    }
    for (k, iv) in intervals.iter().enumerate() {
        let d = iv.end.saturating_sub(iv.start);
        let row = &mut rows[iv.row];
        row.cpu_total_ns += d;
        row.self_cpu_ns += d.saturating_sub(child_ns[k]);
    }
    KeyAverages { rows }
}
