//! Device time of ops and copies, from pairs of timing events recorded around them on their
//! stream, put on the host clock of the records when the profile stops.
//!
//! Note [Device clock]: CUDA events give durations between two events of one device (`cuEventElapsedTime`,
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html>), not wall-clock
//! times. Nothing is synchronised while the profile runs (that would change what it
//! measures): at the end, each device is synchronised, one more event `B` is recorded on its
//! current stream and waited for, and the host time `t_B` is read right after. Every event `e`
//! of that device then sits at `t_B − elapsed(e, B)`. The error is the latency of the last
//! wait (a few microseconds), the same for every event of a device, so overlaps between
//! streams are exact to the events' resolution (about half a microsecond).

use super::record::{self, DeviceSpan, Records};
use crate::cuda::{current_stream, Event, Stream};

/// What a pair of events times.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// `Records::ops[i]`.
    Op(usize),
    /// `Records::copies[i]`.
    Copy(usize),
}

/// Timing events around one piece of device work, waiting for the end of the profile.
#[derive(Debug)]
pub(crate) struct Pending {
    target: Target,
    device: usize,
    stream: u64,
    start: Event,
    end: Event,
}

static PENDING: std::sync::Mutex<Vec<Pending>> = std::sync::Mutex::new(Vec::new());

/// The start event of a piece of work about to be queued on `stream`; `None` when events
/// cannot be recorded (then the work just has no device time).
pub(crate) fn start(stream: &Stream) -> Option<Event> {
    let e = Event::new(true);
    e.record_on(stream).ok().map(|()| e)
}

/// Records the end event on `stream` and files the pair for `target`.
pub(crate) fn finish(target: Target, stream: &Stream, start: Event) {
    let end = Event::new(true);
    if end.record_on(stream).is_ok() {
        record::lock(&PENDING).push(Pending {
            target,
            device: stream.device(),
            stream: stream.as_raw(),
            start,
            end,
        });
    }
}

/// [`start`] on the current stream of CUDA device `device`.
pub(crate) fn start_current(device: usize) -> Option<(Stream, Event)> {
    let s = current_stream(device).ok()?;
    let e = start(&s)?;
    Some((s, e))
}

/// Puts every pending pair on the records' clock (`Note [Device clock]`) and empties the
/// list. Work whose events cannot be read keeps no device span.
pub(crate) fn resolve(records: &mut Records) {
    let pending = std::mem::take(&mut *record::lock(&PENDING));
    let mut devices: Vec<usize> = pending.iter().map(|p| p.device).collect();
    devices.sort_unstable();
    devices.dedup();
    for device in devices {
        let Some((reference, t_ref)) = reference(device) else {
            continue;
        };
        let at = |e: &Event| -> Option<u64> {
            let ms = e.elapsed_time(&reference).ok()?;
            let back = (f64::from(ms) * 1e6).max(0.0) as u64;
            Some(t_ref.saturating_sub(back))
        };
        for p in pending.iter().filter(|p| p.device == device) {
            let (Some(start_ns), Some(end_ns)) = (at(&p.start), at(&p.end)) else {
                continue;
            };
            let span = Some(DeviceSpan {
                device,
                stream: p.stream,
                start_ns,
                end_ns: end_ns.max(start_ns),
            });
            match p.target {
                Target::Op(i) => {
                    if let Some(op) = records.ops.get_mut(i) {
                        op.device_span = span;
                    }
                }
                Target::Copy(i) => {
                    if let Some(c) = records.copies.get_mut(i) {
                        c.device_span = span;
                    }
                }
            }
        }
    }
}

/// The reference event of `device` and its host time: all queued work has run, then one
/// event is recorded and waited for.
fn reference(device: usize) -> Option<(Event, u64)> {
    crate::cuda::synchronize(device).ok()?;
    let stream = current_stream(device).ok()?;
    let e = Event::new(true);
    e.record_on(&stream).ok()?;
    e.synchronize().ok()?;
    let t = record::now_ns();
    Some((e, t))
}

/// Drops every pending pair (a profile abandoned before its end).
pub(crate) fn clear() {
    record::lock(&PENDING).clear();
}
