//! [`MemorySnapshot`] ⇄ the pickle `torch.cuda.memory._dump_snapshot` writes
//! (`torch/csrc/cuda/memory_snapshot.cpp`, PyTorch 2.11).
//!
//! The exported dict has the top-level keys `segments`, `device_traces`, `allocator_settings`
//! and `external_annotations`, in that order, and every segment, block and trace entry has the
//! keys PyTorch writes, in PyTorch's order (`frames` is always empty: berth records no stacks;
//! `compile_context` is `"N/A"` and `user_metadata` `""`, as PyTorch writes them when unused).
//! `pytorch.org/memory_viz` and `python -m torch.cuda._memory_viz` read the result.

use super::decode::int_to_decimal;
use super::error::PickleError;
use super::reader::from_slice;
use super::value::PickleValue;
use super::writer::to_vec;
use crate::backend::StreamId;
use crate::config::{AllocatorConfig, ROUNDUP_INTERVALS};
use crate::snapshot::{
    BlockInfo, BlockState, MemorySnapshot, SegmentInfo, SegmentType, SleepingTag, TraceAction,
    TraceEntry,
};

/// Encodes `snapshot` as the bytes of a `_dump_snapshot` pickle.
///
/// # Examples
///
/// ```
/// use berth_alloc::pickle::{dump_snapshot, load_snapshot};
/// use berth_alloc::{AllocatorConfig, MemorySnapshot};
/// let s = MemorySnapshot {
///     segments: vec![],
///     device_traces: vec![vec![]],
///     allocator_settings: AllocatorConfig::default(),
///     sleeping: vec![],
/// };
/// assert_eq!(load_snapshot(&dump_snapshot(&s))?, s);
/// # Ok::<(), berth_alloc::pickle::PickleError>(())
/// ```
pub fn dump_snapshot(snapshot: &MemorySnapshot) -> Vec<u8> {
    to_vec(&snapshot_to_value(snapshot))
}

/// The key berth adds to the dict of the snapshot files it writes itself
/// ([`dump_snapshot_with_history`]): whether the allocator was recording its history when the
/// snapshot was taken.
///
/// Note [Snapshot history flag]: an empty `device_traces` means "nothing happened" only if
/// history was being recorded; otherwise it means "not recorded" (issue 32, item 4). PyTorch's
/// snapshot dict has no such key (`torch.cuda.memory._snapshot()`,
/// <https://github.com/pytorch/pytorch/blob/main/torch/cuda/memory.py>), so berth adds one only
/// to files that are its own; PyTorch's `memory_viz` reads the dict's keys it knows and
/// ignores the rest, so those files still load there. A PyTorch file does not say
/// ([`load_snapshot_with_history`] answers `None`).
pub const HISTORY_RECORDED_KEY: &str = "berth_history_recorded";

/// [`dump_snapshot`] with [`HISTORY_RECORDED_KEY`] set to `history_recorded` (Note [Snapshot
/// history flag]).
pub fn dump_snapshot_with_history(snapshot: &MemorySnapshot, history_recorded: bool) -> Vec<u8> {
    let mut value = snapshot_to_value(snapshot);
    if let PickleValue::Dict(entries) = &mut value {
        entries.push((
            PickleValue::Str(HISTORY_RECORDED_KEY.to_owned()),
            PickleValue::Bool(history_recorded),
        ));
    }
    to_vec(&value)
}

/// [`load_snapshot`], and whether history was being recorded: `Some` for files written by
/// [`dump_snapshot_with_history`], `None` where the file does not say (PyTorch's).
///
/// # Errors
/// As [`load_snapshot`].
pub fn load_snapshot_with_history(
    data: &[u8],
) -> Result<(MemorySnapshot, Option<bool>), PickleError> {
    let value = from_slice(data)?;
    let recorded = match value.get(HISTORY_RECORDED_KEY) {
        Some(PickleValue::Bool(b)) => Some(*b),
        _ => None,
    };
    Ok((snapshot_from_value(&value)?, recorded))
}

/// Decodes a `_dump_snapshot` pickle (PyTorch's or berth's) into a [`MemorySnapshot`].
///
/// Stack frames, `external_annotations` and per-entry `compile_context` / `user_metadata` are
/// not kept. Trace entries whose action berth does not model (PyTorch's `user_defined` and
/// `annotate`) are skipped; any other action that is not one of [`TraceAction`]'s is refused.
///
/// # Errors
///
/// Every error of [`from_slice`] (naming the byte offset and opcode), and
/// [`PickleError::Schema`] naming the field that is missing or has the wrong type or value.
pub fn load_snapshot(data: &[u8]) -> Result<MemorySnapshot, PickleError> {
    snapshot_from_value(&from_slice(data)?)
}

/// The dict `torch.cuda.memory._snapshot()` returns for `snapshot`.
pub fn snapshot_to_value(snapshot: &MemorySnapshot) -> PickleValue {
    let segments = snapshot.segments.iter().map(segment_to_value).collect();
    let traces = snapshot
        .device_traces
        .iter()
        .map(|t| PickleValue::List(t.iter().map(trace_entry_to_value).collect()))
        .collect();
    let mut value = PickleValue::dict([
        ("segments", PickleValue::List(segments)),
        ("device_traces", PickleValue::List(traces)),
        (
            "allocator_settings",
            settings_to_value(&snapshot.allocator_settings),
        ),
        ("external_annotations", PickleValue::List(Vec::new())),
    ]);
    if let (PickleValue::Dict(entries), false) = (&mut value, snapshot.sleeping.is_empty()) {
        entries.push((
            PickleValue::Str(SLEEPING_KEY.to_owned()),
            PickleValue::List(snapshot.sleeping.iter().map(sleeping_to_value).collect()),
        ));
    }
    value
}

fn segment_to_value(s: &SegmentInfo) -> PickleValue {
    let blocks = s
        .blocks
        .iter()
        .map(|b| {
            PickleValue::dict([
                ("address", b.address.into()),
                ("size", b.size.into()),
                ("requested_size", b.requested_size.into()),
                ("state", b.state.as_str().into()),
                ("frames", PickleValue::List(Vec::new())),
            ])
        })
        .collect();
    PickleValue::dict([
        ("device", PickleValue::Int(i64::from(s.device))),
        ("address", s.address.into()),
        ("total_size", s.total_size.into()),
        ("allocated_size", s.allocated_size.into()),
        ("active_size", s.active_size.into()),
        ("requested_size", s.requested_size.into()),
        ("stream", s.stream.0.into()),
        ("segment_type", s.segment_type.as_str().into()),
        (
            "segment_pool_id",
            PickleValue::Tuple(vec![s.segment_pool_id.0.into(), s.segment_pool_id.1.into()]),
        ),
        ("is_expandable", s.is_expandable.into()),
        ("frames", PickleValue::List(Vec::new())),
        ("blocks", PickleValue::List(blocks)),
    ])
}

/// One entry of `device_traces` (`oom` entries carry `device_free` instead of `addr`, as in
/// PyTorch).
fn trace_entry_to_value(e: &TraceEntry) -> PickleValue {
    let addr_key = if e.action == TraceAction::Oom {
        "device_free"
    } else {
        "addr"
    };
    PickleValue::dict([
        ("action", e.action.as_str().into()),
        (addr_key, e.addr.into()),
        ("size", e.size.into()),
        ("stream", e.stream.0.into()),
        ("time_us", PickleValue::Int(e.time_us)),
        ("compile_context", "N/A".into()),
        ("user_metadata", "".into()),
    ])
}

/// `allocator_settings` as PyTorch 2.11 writes it (`max_split_size` −1 = unlimited;
/// `roundup_power2_divisions` keyed by interval start in MiB, as strings).
fn settings_to_value(c: &AllocatorConfig) -> PickleValue {
    let divisions = (0..ROUNDUP_INTERVALS)
        .map(|i| {
            (
                PickleValue::Str((1u64 << i).to_string()),
                c.roundup_power2_divisions[i].into(),
            )
        })
        .collect();
    let max_split = c
        .max_split_size
        .map_or(PickleValue::Int(-1), PickleValue::from);
    PickleValue::dict([
        ("PYTORCH_CUDA_ALLOC_CONF", c.conf_string.as_str().into()),
        ("max_split_size", max_split),
        (
            "garbage_collection_threshold",
            c.garbage_collection_threshold.into(),
        ),
        ("expandable_segments", c.expandable_segments.into()),
        (
            "pinned_num_register_threads",
            c.pinned_num_register_threads.into(),
        ),
        (
            "release_lock_on_cudamalloc",
            c.release_lock_on_cudamalloc.into(),
        ),
        (
            "pinned_use_cuda_host_register",
            c.pinned_use_cuda_host_register.into(),
        ),
        (
            "graph_capture_record_stream_reuse",
            c.graph_capture_record_stream_reuse.into(),
        ),
        ("roundup_power2_divisions", PickleValue::Dict(divisions)),
    ])
}

/// A cursor into the decoded pickle that remembers its path for [`PickleError::Schema`].
struct Field<'v> {
    path: String,
    value: &'v PickleValue,
}

impl<'v> Field<'v> {
    fn err(&self, expected: impl Into<String>) -> PickleError {
        let found = match self.value {
            PickleValue::Str(s) => format!("str {s:?}"),
            PickleValue::Int(i) => format!("int {i}"),
            PickleValue::BigInt(bytes) => format!("int {}", int_to_decimal(bytes)),
            v => v.type_name().to_owned(),
        };
        PickleError::Schema {
            path: self.path.clone(),
            expected: expected.into(),
            found,
        }
    }

    fn key(&self, key: &str) -> Result<Field<'v>, PickleError> {
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        if self.value.as_dict().is_none() {
            return Err(self.err(format!("a dict with key '{key}'")));
        }
        match self.value.get(key) {
            Some(value) => Ok(Field { path, value }),
            None => Err(PickleError::Schema {
                path,
                expected: "a value".into(),
                found: "no such key".into(),
            }),
        }
    }

    fn opt_key(&self, key: &str) -> Option<Field<'v>> {
        self.key(key).ok()
    }

    fn items(&self) -> Result<Vec<Field<'v>>, PickleError> {
        let items = self.value.as_seq().ok_or_else(|| self.err("a list"))?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, value)| Field {
                path: format!("{}[{i}]", self.path),
                value,
            })
            .collect())
    }

    fn u64(&self) -> Result<u64, PickleError> {
        match self.value {
            PickleValue::Int(i) if *i >= 0 => Ok(*i as u64),
            PickleValue::BigInt(b) if b.len() == 9 && b[8] == 0 => {
                let mut a = [0u8; 8];
                a.copy_from_slice(&b[..8]);
                Ok(u64::from_le_bytes(a))
            }
            _ => Err(self.err("a non-negative int below 2^64")),
        }
    }

    fn i64(&self) -> Result<i64, PickleError> {
        self.value.as_i64().ok_or_else(|| self.err("an int"))
    }

    fn bool(&self) -> Result<bool, PickleError> {
        self.value.as_bool().ok_or_else(|| self.err("a bool"))
    }

    fn str(&self) -> Result<&'v str, PickleError> {
        self.value.as_str().ok_or_else(|| self.err("a str"))
    }
}

/// Reads the dict of `_snapshot()` into a [`MemorySnapshot`] (see [`load_snapshot`]).
///
/// # Errors
///
/// [`PickleError::Schema`] naming the first field that is missing or malformed.
pub fn snapshot_from_value(value: &PickleValue) -> Result<MemorySnapshot, PickleError> {
    let root = Field {
        path: String::new(),
        value,
    };
    if value.as_dict().is_none() {
        return Err(PickleError::Schema {
            path: "<top level>".into(),
            expected: "a dict with keys segments, device_traces, allocator_settings".into(),
            found: value.type_name().into(),
        });
    }
    let segments = root
        .key("segments")?
        .items()?
        .iter()
        .map(segment_from)
        .collect::<Result<Vec<_>, _>>()?;
    let device_traces = match root.opt_key("device_traces") {
        Some(t) => t
            .items()?
            .iter()
            .map(trace_from)
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let allocator_settings = match root.opt_key("allocator_settings") {
        Some(s) => settings_from(&s)?,
        None => AllocatorConfig::default(),
    };
    let sleeping = match root.opt_key(SLEEPING_KEY) {
        Some(t) => t
            .items()?
            .iter()
            .map(sleeping_from)
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    Ok(MemorySnapshot {
        segments,
        device_traces,
        allocator_settings,
        sleeping,
    })
}

/// The key of a snapshot's sleeping tags ([`MemorySnapshot::sleeping`]), written only when
/// some tag sleeps.
pub const SLEEPING_KEY: &str = "berth_sleeping";

fn sleeping_to_value(t: &SleepingTag) -> PickleValue {
    PickleValue::dict([
        ("tag", PickleValue::Str(t.tag.clone())),
        ("released_bytes", t.released_bytes.into()),
        ("allocated_bytes", t.allocated_bytes.into()),
        ("offloaded_bytes", t.offloaded_bytes.into()),
    ])
}

fn sleeping_from(f: &Field<'_>) -> Result<SleepingTag, PickleError> {
    Ok(SleepingTag {
        tag: f.key("tag")?.str()?.to_owned(),
        released_bytes: f.key("released_bytes")?.u64()?,
        allocated_bytes: f.key("allocated_bytes")?.u64()?,
        offloaded_bytes: f.key("offloaded_bytes")?.u64()?,
    })
}

fn segment_from(f: &Field<'_>) -> Result<SegmentInfo, PickleError> {
    let device = f.key("device")?;
    let device = i32::try_from(device.i64()?)
        .map_err(|_| device.err("a device index that fits in 32 bits"))?;
    let segment_type = f.key("segment_type")?;
    let segment_type = match segment_type.str()? {
        "small" => SegmentType::Small,
        "large" => SegmentType::Large,
        _ => return Err(segment_type.err("'small' or 'large'")),
    };
    let segment_pool_id = match f.opt_key("segment_pool_id") {
        Some(p) => {
            let items = p.items()?;
            if items.len() != 2 {
                return Err(p.err("a pair (int, int)"));
            }
            (items[0].u64()?, items[1].u64()?)
        }
        None => (0, 0),
    };
    let blocks = f
        .key("blocks")?
        .items()?
        .iter()
        .map(block_from)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SegmentInfo {
        device,
        address: f.key("address")?.u64()?,
        total_size: f.key("total_size")?.u64()?,
        allocated_size: f.key("allocated_size")?.u64()?,
        active_size: f.key("active_size")?.u64()?,
        requested_size: f.key("requested_size")?.u64()?,
        stream: StreamId(f.key("stream")?.u64()?),
        segment_type,
        segment_pool_id,
        is_expandable: match f.opt_key("is_expandable") {
            Some(e) => e.bool()?,
            None => false,
        },
        blocks,
    })
}

fn block_from(f: &Field<'_>) -> Result<BlockInfo, PickleError> {
    let state = f.key("state")?;
    let state = match state.str()? {
        "active_allocated" => BlockState::ActiveAllocated,
        "active_pending_free" => BlockState::ActivePendingFree,
        "inactive" => BlockState::Inactive,
        _ => return Err(state.err("'active_allocated', 'active_pending_free' or 'inactive'")),
    };
    Ok(BlockInfo {
        address: f.key("address")?.u64()?,
        size: f.key("size")?.u64()?,
        requested_size: f.key("requested_size")?.u64()?,
        state,
    })
}

/// Trace actions PyTorch writes that berth does not model: entries of
/// `torch.cuda.memory._record_memory_history` that mark a point in time rather than change
/// memory (`TraceEntry::USER_DEFINED` in
/// <https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.h>, and
/// annotations). [`load_snapshot`] skips them; any other unknown action is an error.
const NOT_MODELLED_ACTIONS: [&str; 2] = ["user_defined", "annotate"];

fn trace_from(f: &Field<'_>) -> Result<Vec<TraceEntry>, PickleError> {
    let mut out = Vec::new();
    for e in f.items()? {
        let action = e.key("action")?;
        let name = action.str()?;
        let Ok(parsed) = name.parse::<TraceAction>() else {
            if NOT_MODELLED_ACTIONS.contains(&name) {
                continue; // nothing to replay or draw
            }
            return Err(action.err(format!(
                "one of PyTorch's trace actions ({}; {} are skipped)",
                TraceAction::ALL.map(TraceAction::as_str).join(", "),
                NOT_MODELLED_ACTIONS.join(" and ")
            )));
        };
        let addr = if parsed == TraceAction::Oom {
            e.opt_key("device_free").or_else(|| e.opt_key("addr"))
        } else {
            e.opt_key("addr")
        };
        let addr = match addr {
            Some(a) => a.u64()?,
            None => {
                return Err(match e.key("addr") {
                    Err(err) => err,
                    Ok(_) => e.err("a dict with key 'addr'"),
                })
            }
        };
        out.push(TraceEntry {
            action: parsed,
            addr,
            size: e.key("size")?.u64()?,
            stream: StreamId(e.key("stream")?.u64()?),
            time_us: match e.opt_key("time_us") {
                Some(t) => t.i64()?,
                None => 0,
            },
        });
    }
    Ok(out)
}

fn settings_from(f: &Field<'_>) -> Result<AllocatorConfig, PickleError> {
    let mut c = AllocatorConfig::default();
    if f.value.as_dict().is_none() {
        return Err(f.err("a dict"));
    }
    if let Some(s) = f.opt_key("PYTORCH_CUDA_ALLOC_CONF") {
        c.conf_string = s.str()?.to_owned();
    }
    if let Some(m) = f.opt_key("max_split_size") {
        c.max_split_size = match m.i64()? {
            -1 => None,
            v if v > 0 => Some(v as u64),
            _ => return Err(m.err("-1 (unlimited) or a positive size in bytes")),
        };
    }
    if let Some(g) = f.opt_key("garbage_collection_threshold") {
        // PyTorch writes 0.0 when the option is unset and accepts only 0 < t < 1 when set; a
        // NaN read from a file made the loaded settings unequal to themselves (found by fuzzing:
        // dump, then load, changed the snapshot).
        let t = g.value.as_f64().ok_or_else(|| g.err("a float"))?;
        if !(0.0..1.0).contains(&t) {
            return Err(g.err("a float in [0, 1) (0 when unset)"));
        }
        c.garbage_collection_threshold = t;
    }
    for (key, slot) in [
        ("expandable_segments", &mut c.expandable_segments),
        (
            "release_lock_on_cudamalloc",
            &mut c.release_lock_on_cudamalloc,
        ),
        (
            "pinned_use_cuda_host_register",
            &mut c.pinned_use_cuda_host_register,
        ),
        (
            "graph_capture_record_stream_reuse",
            &mut c.graph_capture_record_stream_reuse,
        ),
    ] {
        if let Some(b) = f.opt_key(key) {
            *slot = b.bool()?;
        }
    }
    if let Some(t) = f.opt_key("pinned_num_register_threads") {
        c.pinned_num_register_threads = t.u64()?;
    }
    if let Some(d) = f.opt_key("roundup_power2_divisions") {
        let pairs = d
            .value
            .as_dict()
            .ok_or_else(|| d.err("a dict {interval MiB: divisions}"))?;
        for (k, v) in pairs {
            let mib = match k {
                PickleValue::Str(s) => s.parse::<u64>().ok(),
                PickleValue::Int(i) => u64::try_from(*i).ok(),
                _ => None,
            };
            let index = mib
                .filter(|m| m.is_power_of_two())
                .map(|m| m.trailing_zeros() as usize);
            let field = Field {
                path: format!("{}[{k}]", d.path),
                value: v,
            };
            match index {
                Some(i) if i < ROUNDUP_INTERVALS => c.roundup_power2_divisions[i] = field.u64()?,
                _ => {
                    return Err(field.err(format!(
                        "a key that is a power of two from 1 to {} (MiB)",
                        1u64 << (ROUNDUP_INTERVALS - 1)
                    )))
                }
            }
        }
    }
    Ok(c)
}

/// The history of `device` in `snapshot` as trace rows that [`crate::replay::replay`] consumes.
/// Empty when the snapshot has no history for that device.
#[cfg(feature = "trace")]
pub fn snapshot_trace(snapshot: &MemorySnapshot, device: usize) -> crate::trace::Trace {
    let events = snapshot
        .device_traces
        .get(device)
        .map(|t| {
            t.iter()
                .map(|e| crate::trace::TraceEvent {
                    action: e.action,
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    time_us: e.time_us,
                })
                .collect()
        })
        .unwrap_or_default();
    crate::trace::Trace {
        alloc_conf: Some(snapshot.allocator_settings.conf_string.clone()),
        events,
        ..Default::default()
    }
}

/// Reads a `_dump_snapshot` pickle straight into the trace of device 0, for `berth replay`.
///
/// # Errors
/// As [`load_snapshot`].
#[cfg(feature = "trace")]
pub fn load_trace_pickle(data: &[u8]) -> Result<crate::trace::Trace, PickleError> {
    Ok(snapshot_trace(&load_snapshot(data)?, 0))
}
