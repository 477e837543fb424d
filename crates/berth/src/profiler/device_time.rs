//! Device time of ops and copies: from CUPTI's activity records where CUPTI loads
//! (`Note [Activity tracing]` in berth-cuda's `activity.rs`), else from pairs of timing events
//! recorded around them on their stream, put on the host clock of the records.
//!
//! Note [Device clock]: CUDA events give durations between two events of one device
//! (`cuEventElapsedTime`, <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EVENT.html>),
//! not wall-clock times. So each device gets a *reference* event `R` the first time the
//! profile times work on it (at `start()` for devices already in use): `R` is recorded on the
//! device's current stream and waited for, and the host time `t_R` is read right after. Every
//! event `e` of that device then sits at `t_R + elapsed(R, e)`. The error is the latency of
//! that one wait (a few microseconds), the same for every event of a device, so overlaps
//! between streams are exact to the events' resolution (about half a microsecond; `f32`
//! milliseconds lose a few microseconds after a minute). Nothing else waits while the profile
//! runs: pairs whose end event has completed are resolved as the list grows (a query, no
//! wait), and their events go back to a pool, so a long profile creates no events in its
//! steady state and holds a bounded number; `stop()` waits for the rest.
//!
//! Note [CUPTI device time]: with CUPTI, an op or copy pushes a fresh external id before it
//! launches and pops it after; [`resolve`] waits for the devices, stops the trace and gives
//! each op the span from its first kernel's (or copy's, or memset's) start to its last one's
//! end, on the stream the op was queued on. Per op that is two thread-local CUPTI calls and
//! one uncontended lock instead of two event records and, later, a query and two elapsed-time
//! calls. An op that launched nothing (a view, or work CUPTI did not see) has no device span,
//! where events would have given it the launch gap.

use super::record::{self, DeviceSpan, Records};
use super::DeviceTimer;
use crate::cuda::{current_stream, Event, Stream};
use berth_cuda::activity::{self, ActivityTrace};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// What a pair of events times.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// `Records::ops[i]`.
    Op(usize),
    /// `Records::copies[i]`.
    Copy(usize),
}

/// Timing events around one piece of device work.
#[derive(Debug)]
struct Pending {
    target: Target,
    device: usize,
    stream: u64,
    start: Event,
    end: Event,
}

/// A device's reference event and its host time.
#[derive(Debug)]
struct Clock {
    reference: Event,
    t_ref_ns: u64,
}

/// Work tagged with an external id under CUPTI.
#[derive(Debug, Clone, Copy)]
struct Tag {
    id: u64,
    target: Target,
    device: usize,
    stream: u64,
}

/// How a started piece of work is timed.
#[derive(Debug)]
pub(crate) enum Started {
    /// The start event, recorded on the work's stream.
    Event(Event),
    /// The external id pushed for it.
    Cupti(u64),
}

/// How the device time of a profile was measured, and why CUPTI was not used if it was not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimerUsed {
    pub(crate) timer: DeviceTimer,
    pub(crate) fallback: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    trace: Option<ActivityTrace>,
    tags: Vec<Tag>,
    used: Option<TimerUsed>,
    clocks: HashMap<usize, Clock>,
    pending: VecDeque<Pending>,
    pool: HashMap<usize, Vec<Event>>,
    resolved: Vec<(Target, DeviceSpan)>,
    /// The pending length at which completed pairs are resolved next.
    next_resolve: usize,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Set while a CUPTI trace times this profile's work.
static CUPTI: AtomicBool = AtomicBool::new(false);
/// The next external id.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Pending pairs beyond which completed ones are resolved and recycled.
const RESOLVE_AT: usize = 1024;
/// Events made ready per device when a profile starts.
const POOL_START: usize = 512;

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = record::lock(&STATE);
    f(g.get_or_insert_with(State::default))
}

/// Makes the reference event of `device` if it has none (one wait, not recorded as a host
/// wait of the program), and fills its event pool.
fn ensure_clock(s: &mut State, device: usize) -> Option<()> {
    if s.clocks.contains_key(&device) {
        return Some(());
    }
    let stream = current_stream(device).ok()?;
    let pool = s.pool.entry(device).or_default();
    while pool.len() < POOL_START {
        // Recording makes the driver event; the wait below covers these records too.
        let e = Event::new(true);
        e.record_on(&stream).ok()?;
        pool.push(e);
    }
    let reference = Event::new(true);
    reference.record_on(&stream).ok()?;
    record::internal(|| reference.synchronize()).ok()?;
    let t_ref_ns = record::now_ns();
    s.clocks.insert(
        device,
        Clock {
            reference,
            t_ref_ns,
        },
    );
    Some(())
}

/// Called when a profile starts: a CUPTI trace where `timer` allows and CUPTI loads, else
/// references for the devices already in use.
///
/// # Errors
/// `timer` is [`DeviceTimer::Cupti`] and CUPTI cannot trace: why.
pub(crate) fn begin(timer: DeviceTimer) -> Result<(), String> {
    with(|s| {
        s.pending.clear();
        s.resolved.clear();
        s.clocks.clear();
        s.tags.clear();
        s.trace = None;
        s.next_resolve = RESOLVE_AT;
        let mut fallback = None;
        if timer != DeviceTimer::CudaEvents {
            match activity::start_trace(record::now_ns) {
                Ok(t) => {
                    s.trace = Some(t);
                    s.used = Some(TimerUsed {
                        timer: DeviceTimer::Cupti,
                        fallback: None,
                    });
                    CUPTI.store(true, Ordering::SeqCst);
                    return Ok(());
                }
                Err(e) if timer == DeviceTimer::Cupti => return Err(e.to_string()),
                Err(e) => fallback = Some(e.to_string()),
            }
        }
        CUPTI.store(false, Ordering::SeqCst);
        s.used = Some(TimerUsed {
            timer: DeviceTimer::CudaEvents,
            fallback,
        });
        for d in crate::cuda::initialized_devices() {
            let _ = ensure_clock(s, d);
        }
        Ok(())
    })
}

fn take_recorded(s: &mut State, stream: &Stream) -> Option<Event> {
    let e = s
        .pool
        .get_mut(&stream.device())
        .and_then(Vec::pop)
        .unwrap_or_else(|| Event::new(true));
    e.record_on(stream).ok().map(|()| e)
}

/// Starts timing a piece of work about to be queued on `stream`; `None` when it cannot be
/// timed there (then the work has no device time).
pub(crate) fn start(stream: &Stream) -> Option<Started> {
    if CUPTI.load(Ordering::Relaxed) {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        activity::push_external_id(id);
        return Some(Started::Cupti(id));
    }
    with(|s| {
        ensure_clock(s, stream.device())?;
        take_recorded(s, stream).map(Started::Event)
    })
}

/// [`start`] on the current stream of CUDA device `device`.
pub(crate) fn start_current(device: usize) -> Option<(Stream, Started)> {
    let stream = current_stream(device).ok()?;
    let e = start(&stream)?;
    Some((stream, e))
}

/// Drops the timing of work that was not queued after all (its events unused; its CUPTI
/// external id popped).
pub(crate) fn abandon(start: Started) {
    if let Started::Cupti(_) = start {
        activity::pop_external_id();
    }
}

/// Ends the timing of `start` on `stream` and files it for `target`.
pub(crate) fn finish(target: Target, stream: &Stream, start: Started) {
    let start = match start {
        Started::Cupti(id) => {
            activity::pop_external_id();
            let tag = Tag {
                id,
                target,
                device: stream.device(),
                stream: stream.as_raw(),
            };
            return with(|s| s.tags.push(tag));
        }
        Started::Event(e) => e,
    };
    with(|s| {
        let Some(end) = take_recorded(s, stream) else {
            return;
        };
        s.pending.push_back(Pending {
            target,
            device: stream.device(),
            stream: stream.as_raw(),
            start,
            end,
        });
        if s.pending.len() >= s.next_resolve.max(RESOLVE_AT) {
            resolve_completed(s);
            s.next_resolve = s.pending.len() + RESOLVE_AT;
        }
    });
}

/// Resolves `p` against its device's clock and returns its events to the pool.
fn settle(s: &mut State, p: Pending) {
    if let Some(c) = s.clocks.get(&p.device) {
        let at = |e: &Event| -> Option<u64> {
            let ms = c.reference.elapsed_time(e).ok()?;
            Some(
                c.t_ref_ns
                    .saturating_add((f64::from(ms) * 1e6).max(0.0) as u64),
            )
        };
        if let (Some(start_ns), Some(end_ns)) = (at(&p.start), at(&p.end)) {
            s.resolved.push((
                p.target,
                DeviceSpan {
                    device: p.device,
                    stream: p.stream,
                    start_ns,
                    end_ns: end_ns.max(start_ns),
                },
            ));
        }
    }
    let pool = s.pool.entry(p.device).or_default();
    pool.push(p.start);
    pool.push(p.end);
}

/// Resolves the oldest pairs, up to the first whose end event has not completed (queries
/// only, never a wait; the caller spaces the calls out, so each pair is queried about once).
fn resolve_completed(s: &mut State) {
    while let Some(p) = s.pending.pop_front() {
        if p.end.query().unwrap_or(false) {
            settle(s, p);
        } else {
            s.pending.push_front(p);
            break;
        }
    }
}

/// Waits for the devices with pending work, resolves it all and puts every span on its
/// record; the clocks (or the CUPTI trace) are dropped (the next profile makes new ones).
/// Returns how the device time was measured (`None`: CUDA activity was not asked for).
pub(crate) fn resolve(records: &mut Records) -> Option<TimerUsed> {
    with(|s| {
        if let Some(trace) = s.trace.take() {
            CUPTI.store(false, Ordering::SeqCst);
            let mut devices: Vec<usize> = s.tags.iter().map(|t| t.device).collect();
            devices.sort_unstable();
            devices.dedup();
            for d in devices {
                let _ = record::internal(|| crate::cuda::synchronize(d));
            }
            let by_id: HashMap<u64, usize> =
                s.tags.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
            let mut spans: HashMap<usize, (u64, u64)> = HashMap::new();
            for a in trace.stop() {
                if let Some(&i) = by_id.get(&a.external_id) {
                    let e = spans.entry(i).or_insert((a.start_ns, a.end_ns));
                    e.0 = e.0.min(a.start_ns);
                    e.1 = e.1.max(a.end_ns);
                }
            }
            for (i, (start_ns, end_ns)) in spans {
                let t = s.tags[i];
                s.resolved.push((
                    t.target,
                    DeviceSpan {
                        device: t.device,
                        stream: t.stream,
                        start_ns,
                        end_ns,
                    },
                ));
            }
            s.tags.clear();
        } else {
            let mut devices: Vec<usize> = s.pending.iter().map(|p| p.device).collect();
            devices.sort_unstable();
            devices.dedup();
            for d in devices {
                let _ = record::internal(|| crate::cuda::synchronize(d));
            }
            while let Some(p) = s.pending.pop_front() {
                settle(s, p);
            }
        }
        for (target, span) in s.resolved.drain(..) {
            match target {
                Target::Op(i) => {
                    if let Some(op) = records.ops.get_mut(i) {
                        op.device_span = Some(span);
                    }
                }
                Target::Copy(i) => {
                    if let Some(c) = records.copies.get_mut(i) {
                        c.device_span = Some(span);
                    }
                }
            }
        }
        s.clocks.clear();
        s.used.take()
    })
}

/// Drops every pending pair (a profile abandoned before its end); their events are not
/// reused, as they may still be queued. A CUPTI trace is stopped and its records dropped.
pub(crate) fn clear() {
    with(|s| {
        CUPTI.store(false, Ordering::SeqCst);
        s.trace = None;
        s.tags.clear();
        s.used = None;
        s.pending.clear();
        s.resolved.clear();
        s.clocks.clear();
    });
}
