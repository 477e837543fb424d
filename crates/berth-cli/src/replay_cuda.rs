//! `berth replay --device cuda:N`: PyTorch traces through berth's allocators on the real GPU
//! (berth's CUDA backend: `cuMemAlloc` / `cuMemFree`, or the virtual-memory calls for
//! `expandable` and `paged`).
//!
//! Like PyTorch's own C++ replay (`shared/bench/torch_replay.py`), every event goes to the
//! default stream and the trace is replayed twice on one allocator: the first pass is cold
//! (segments come from the driver), the second warm (from the cache); `ns_per_op` is the warm
//! pass. After the passes the allocator's reserved bytes are compared with the device-wide
//! used memory from `cuMemGetInfo`, then `empty_cache` must give them back.

use anyhow::Context;
use berth::cuda::{mem_get_info, CudaBackend};
use berth_alloc::replay::replay;
use berth_alloc::trace::{Trace, TraceEvent};
use berth_alloc::StreamId;

use crate::replay::Policy;

/// Replays `traces` with each policy on CUDA device `index`, printing one line (JSON or text)
/// per trace and policy.
///
/// # Errors
/// CUDA unavailable, out of memory, or a replay error naming the event.
pub fn run(
    index: usize,
    traces: &[(String, Trace)],
    policies: &[Policy],
    json: bool,
) -> anyhow::Result<()> {
    for (name, trace) in traces {
        let events: Vec<TraceEvent> = trace
            .events
            .iter()
            .map(|e| TraceEvent {
                stream: StreamId::DEFAULT,
                ..*e
            })
            .collect();
        for &policy in policies {
            let alloc = policy.allocator(CudaBackend::new(index)?)?;
            let (free_before, _) = mem_get_info(index)?;
            let cold = replay(&events, alloc.as_ref())
                .with_context(|| format!("{name} / {} cold", policy.name()))?;
            let warm = replay(&events, alloc.as_ref())
                .with_context(|| format!("{name} / {} warm", policy.name()))?;
            let (free_after, _) = mem_get_info(index)?;
            let reserved = alloc.stats().memory_reserved();
            let used_delta = free_before as i64 - free_after as i64;
            alloc.empty_cache()?;
            let (free_emptied, _) = mem_get_info(index)?;
            let released = free_emptied as i64 - free_after as i64;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "trace": name, "policy": policy.name(), "device": format!("cuda:{index}"),
                        "ops": warm.ops, "peak_requested": cold.peak_requested,
                        "peak_reserved": cold.peak_reserved, "device_allocs": cold.device_allocs,
                        "device_calls": cold.device_calls,
                        "cold_ns_per_op": (cold.ns_per_op * 10.0).round() / 10.0,
                        "ns_per_op": (warm.ns_per_op * 10.0).round() / 10.0,
                        "reserved_after": reserved, "cumemgetinfo_used_delta": used_delta,
                        "released_by_empty_cache": released,
                    })
                );
            } else {
                println!(
                    "{name:<22} {:<10} cuda:{index}  peak reserved {:>12}  segments {:>4}  cold {:>7.1} ns/op  warm {:>7.1} ns/op  reserved {} vs cuMemGetInfo used +{} (empty_cache gave back {})",
                    policy.name(),
                    cold.peak_reserved,
                    cold.device_allocs,
                    cold.ns_per_op,
                    warm.ns_per_op,
                    reserved,
                    used_delta,
                    released
                );
            }
        }
    }
    Ok(())
}
