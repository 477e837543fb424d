//! `memory_summary()` in PyTorch's table layout (`torch/cuda/memory.py`, `memory_summary`).

use crate::backend::MemInfo;
use crate::stats::{format_size, MemoryStats, Stat, StatArray, StatKind};

/// PyTorch's `_format_size`: the number truncated, the unit chosen from `pref` (the "all" row
/// of the column), moving up while `pref ≥ 768 × 1024` of the current unit.
fn format_bytes(mut value: i64, pref: i64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = UNITS[0];
    let mut pref = pref as f64;
    for next in &UNITS[1..] {
        if pref < 768.0 * 1024.0 {
            break;
        }
        unit = next;
        value = value.div_euclid(1024);
        pref /= 1024.0;
    }
    format!("{value:6} {unit}")
}

/// PyTorch's `_format_count`: blank, K or M with a threshold of 750 × 1000.
fn format_count(mut value: i64, pref: i64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let mut unit = UNITS[0];
    let mut pref = pref as f64;
    for next in &UNITS[1..] {
        if pref < 750.0 * 1000.0 {
            break;
        }
        unit = next;
        value = value.div_euclid(1000);
        pref /= 1000.0;
    }
    format!("{value:7} {unit} ")
}

fn row(lines: &mut Vec<String>, name: &str, stat: &Stat, pref: &Stat, f: fn(i64, i64) -> String) {
    lines.push(format!(
        " {:<21} | {} | {} | {} | {} ",
        name,
        f(stat.current, pref.current),
        f(stat.peak, pref.peak),
        f(stat.allocated, pref.allocated),
        f(stat.freed, pref.freed)
    ));
}

/// Renders `stats` as `torch.cuda.memory_summary(device, abbreviated)` does: 77-character lines
/// framed by `|`, byte rows then count rows, each with "all" and (unless `abbreviated`) large-
/// and small-pool rows, then the oversize rows. One line more than PyTorch's, under the title,
/// names the allocator `policy` (`pytorch`, `expandable` or `paged`:
/// [`crate::DeviceAllocator::policy_name`]).
///
/// With `driver` (the device's `cuMemGetInfo`, through [`crate::MemoryBackend::mem_info`]),
/// four lines more at the end put berth's figure and the driver's side by side: the device's
/// used bytes (total − free), the part of them berth reserved and the rest (the CUDA context,
/// other libraries, other processes on the device), and the waste, peak reserved ÷ peak
/// allocated − 1, with both peaks. berth keeps no device memory outside its reserved bytes (`Note [VMM handles]` in
/// `berth-cuda`), so the rest is memory berth does not own.
pub fn memory_summary(
    stats: &MemoryStats,
    device: i32,
    policy: &str,
    abbreviated: bool,
    driver: Option<MemInfo>,
) -> String {
    let mut lines = vec![
        "=".repeat(75),
        format!(
            " {:16} PyTorch CUDA memory summary, device ID {:<17} ",
            "", device
        ),
        format!("{:^75}", format!("allocator policy: {policy}")),
        "-".repeat(75),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        "=".repeat(75),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_owned(),
    ];
    type Metric<'a> = (&'a StatArray, &'static str, fn(i64, i64) -> String);
    let metrics: [Metric<'_>; 9] = [
        (&stats.allocated_bytes, "Allocated memory", format_bytes),
        (&stats.active_bytes, "Active memory", format_bytes),
        (&stats.requested_bytes, "Requested memory", format_bytes),
        (&stats.reserved_bytes, "GPU reserved memory", format_bytes),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            format_bytes,
        ),
        (&stats.allocation, "Allocations", format_count),
        (&stats.active, "Active allocs", format_count),
        (&stats.segment, "GPU reserved segments", format_count),
        (&stats.inactive_split, "Non-releasable allocs", format_count),
    ];
    for (array, name, f) in metrics {
        lines.push("-".repeat(75));
        let all = array.get(StatKind::Aggregate);
        row(&mut lines, name, all, all, f);
        if !abbreviated {
            row(
                &mut lines,
                "      from large pool",
                array.get(StatKind::LargePool),
                all,
                f,
            );
            row(
                &mut lines,
                "      from small pool",
                array.get(StatKind::SmallPool),
                all,
                f,
            );
        }
    }
    for (stat, name) in [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize GPU segments"),
    ] {
        lines.push("-".repeat(75));
        row(&mut lines, name, stat, stat, format_count);
    }
    lines.push("=".repeat(75));
    if let Some(info) = driver {
        lines.extend(driver_lines(stats, info));
        lines.push("=".repeat(75));
    }
    format!("|{}|\n", lines.join("|\n|"))
}

/// The driver's side of the summary: used bytes, the part berth reserved and the rest, and the
/// waste of peak reserved over peak allocated; each line padded to 75 characters.
fn driver_lines(stats: &MemoryStats, info: MemInfo) -> Vec<String> {
    let used = info.total_bytes.saturating_sub(info.free_bytes);
    let reserved = stats.memory_reserved();
    let (peak_reserved, peak_allocated) =
        (stats.max_memory_reserved(), stats.max_memory_allocated());
    let waste = if peak_allocated == 0 {
        "n/a (no allocation since the peaks were reset)".to_owned()
    } else {
        format!(
            "{:.2}% (peak reserved over peak allocated)",
            (peak_reserved as f64 / peak_allocated as f64 - 1.0) * 100.0
        )
    };
    [
        format!(
            " Driver (cuMemGetInfo): {} used of {}",
            format_size(used),
            format_size(info.total_bytes)
        ),
        format!(
            "   reserved by berth {}, outside berth {}",
            format_size(reserved),
            format_size(used.saturating_sub(reserved))
        ),
        format!(" Waste: {waste}"),
        format!(
            "   peak reserved {}, peak allocated {}",
            format_size(peak_reserved),
            format_size(peak_allocated)
        ),
    ]
    .into_iter()
    .map(|l| {
        // Clipped to the frame, whatever the figures (a waste of 10^8 % after a peak reset).
        let l: String = l.chars().take(75).collect();
        format!("{l:<75}")
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_match_pytorch_output() {
        assert_eq!(format_bytes(8192 * 1024, 8192 * 1024), "  8192 KiB");
        assert_eq!(format_bytes(315396 * 1024, 315396 * 1024), "315396 KiB");
        assert_eq!(format_bytes(4608, 315392 * 1024), "     4 KiB");
        assert_eq!(format_count(4, 4), "      4   ");
    }

    #[test]
    fn every_line_is_77_characters() {
        let text = memory_summary(&MemoryStats::new(None), 0, "paged", false, None);
        assert!(text.lines().all(|l| l.chars().count() == 77), "{text}");
        assert!(text.contains(
            "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |"
        ));
        assert!(text.contains("allocator policy: paged"), "{text}");
        assert!(!text.contains("Driver"), "no driver lines without mem_info");
    }

    #[test]
    fn driver_lines_show_used_reserved_and_waste() {
        let mut stats = MemoryStats::new(None);
        stats.reserved_bytes.increase(false, 40 << 20);
        stats.allocated_bytes.increase(false, 32 << 20);
        let info = MemInfo {
            free_bytes: (1 << 30) - (40 << 20) - (500 << 20),
            total_bytes: 1 << 30,
        };
        let text = memory_summary(&stats, 0, "paged", true, Some(info));
        assert!(text.lines().all(|l| l.chars().count() == 77), "{text}");
        for want in [
            "| Driver (cuMemGetInfo): 540.00 MiB used of 1024.00 MiB",
            "|   reserved by berth 40.00 MiB, outside berth 500.00 MiB",
            "| Waste: 25.00% (peak reserved over peak allocated)",
            "|   peak reserved 40.00 MiB, peak allocated 32.00 MiB",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn driver_lines_stay_in_the_frame_for_extreme_figures() {
        let mut stats = MemoryStats::new(None);
        stats.reserved_bytes.increase(false, 1 << 40);
        stats.allocated_bytes.increase(false, 512);
        let info = MemInfo {
            free_bytes: 0,
            total_bytes: u64::MAX,
        };
        let text = memory_summary(&stats, 0, "paged", false, Some(info));
        assert!(text.lines().all(|l| l.chars().count() == 77), "{text}");
        assert!(
            text.contains("| Waste: 214748364700.00% (peak reserved over peak allocated)"),
            "{text}"
        );
        stats.allocated_bytes.decrease(false, 512);
        stats.reset_peak();
        let text = memory_summary(&stats, 0, "paged", false, Some(info));
        assert!(
            text.contains("| Waste: n/a (no allocation since the peaks were reset)"),
            "{text}"
        );
    }
}
