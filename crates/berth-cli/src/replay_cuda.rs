//! `berth replay --device cuda:N`: PyTorch traces through berth's allocators on the real GPU
//! (berth's CUDA backend: `cuMemAlloc` / `cuMemFree`, or the virtual-memory calls for
//! `expandable` and `paged`).
//!
//! Like PyTorch's own allocator replayed from C++ (`BENCHMARKS.md`), every event goes to the
//! default stream, the trace is compiled outside the timing (`Note [Compiled replay]` in
//! `berth_alloc::replay`) and replayed [`PASSES`] times on one allocator: the first pass is
//! cold (segments come from the driver), the others warm (from the cache); `ns_per_op` is the
//! fastest warm pass. After the passes the allocator's reserved bytes are compared with the
//! growth of the device-wide used memory from `cuMemGetInfo` (the CUDA backend keeps no memory
//! of its own: `Note [VMM handles]` in `berth::cuda::backend`, so the two are equal); then
//! `empty_cache` must give them back. Each line states berth's reserved bytes, the driver's
//! used bytes and the waste (peak reserved ÷ peak requested) side by side.

use anyhow::Context;
use berth::cuda::{mem_get_info, CudaBackend};
use berth_alloc::stats::format_size;
use berth_alloc::StreamId;

use berth_alloc::Policy;

use crate::replay::load::LoadedTrace;
use crate::replay::passes::{passes, replay_allocator, warm_ns, PASSES};

/// Replays `traces` with each policy on CUDA device `index`, printing one line (JSON or text)
/// per trace and policy.
///
/// # Errors
/// CUDA unavailable, out of memory, or a replay error naming the event.
pub fn run(
    index: usize,
    traces: &[(String, LoadedTrace)],
    policies: &[Policy],
    conf: &berth_alloc::AllocatorConfig,
    json: bool,
) -> anyhow::Result<()> {
    for (name, trace) in traces {
        let compiled = trace.compiled.clone().on_stream(StreamId::DEFAULT);
        for &policy in policies {
            let backend = CudaBackend::new(index)?;
            let alloc = replay_allocator(policy, backend, conf)?;
            let (free_before, _) = mem_get_info(index)?;
            let (cold, warm) = passes(&compiled, alloc.as_ref())
                .with_context(|| format!("{name} / {}", policy.name()))?;
            let (free_after, _) = mem_get_info(index)?;
            let reserved = alloc.stats().memory_reserved();
            let used_delta = free_before as i64 - free_after as i64;
            alloc.empty_cache()?;
            let reserved_emptied = alloc.stats().memory_reserved();
            let (free_emptied, _) = mem_get_info(index)?;
            let released = free_emptied as i64 - free_after as i64;
            let agrees = reserved as i64 == used_delta;
            let waste = cold.ratio().map_or(0.0, |r| r - 1.0);
            let warm_ns_per_op = warm_ns(&warm);
            let warm_calls = warm.iter().map(|r| r.device_calls).max().unwrap_or(0);
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "trace": name, "policy": policy.name(), "device": format!("cuda:{index}"),
                        "ops": cold.ops, "passes": PASSES, "peak_requested": cold.peak_requested,
                        "peak_reserved": cold.peak_reserved, "device_allocs": cold.device_allocs,
                        "device_calls": cold.device_calls, "warm_device_calls": warm_calls,
                        "cold_ns_per_op": (cold.ns_per_op * 10.0).round() / 10.0,
                        "warm_ns_per_op": warm.iter().map(|r| (r.ns_per_op * 10.0).round() / 10.0).collect::<Vec<_>>(),
                        "ns_per_op": (warm_ns_per_op * 10.0).round() / 10.0,
                        "waste": (waste * 1e6).round() / 1e6,
                        "reserved_after": reserved,
                        "cumemgetinfo_used_delta": used_delta, "reserved_agrees_with_driver": agrees,
                        "reserved_after_empty_cache": reserved_emptied,
                        "released_by_empty_cache": released,
                    })
                );
            } else {
                println!(
                    "{name:<22} {:<10} cuda:{index}  peak reserved {:>12} (waste {:.2}%)  segments {:>4}  cold {:>7.1} ns/op  warm {:>7.1} ns/op ({warm_calls} device calls)  reserved {} vs cuMemGetInfo used {}{} ({}; empty_cache gave back {}{})",
                    policy.name(),
                    format_size(cold.peak_reserved),
                    waste * 100.0,
                    cold.device_allocs,
                    cold.ns_per_op,
                    warm_ns_per_op,
                    format_size(reserved),
                    if used_delta < 0 { "-" } else { "+" },
                    format_size(used_delta.unsigned_abs()),
                    if agrees { "equal" } else { "DIFFERENT" },
                    if released < 0 { "-" } else { "" },
                    format_size(released.unsigned_abs()),
                );
            }
        }
    }
    Ok(())
}
