//! Events (`torch.cuda.Event`): `Event::new(enable_timing)`, `record`, `query`, `synchronize`,
//! `elapsed_time(&end)` in ms, with PyTorch's typed errors ("not ready" rather than a driver
//! error, <https://github.com/pytorch/pytorch/issues/85796>).
//!
//! As in PyTorch, the driver event is created lazily by the first `record`, on the recording
//! stream's device; an event never recorded counts as complete. Driver events are pooled per
//! device and reused after an `Event` drops (Note [Event pool] in `event_pool.rs`).

use crate::stream::{current_stream_of_current_device, Stream};
use crate::{ffi, CudaError};
use std::sync::Mutex;

/// A CUDA event. `Send + Sync`; dropping it destroys the driver event.
pub struct Event {
    enable_timing: bool,
    /// `(device, raw CUevent)` once recorded.
    state: Mutex<Option<(usize, u64)>>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("enable_timing", &self.enable_timing)
            .field("recorded", &self.recorded())
            .finish()
    }
}

impl Event {
    /// A new event (`torch.cuda.Event(enable_timing=...)`). Creates nothing on a device until
    /// [`Event::record`]; timing costs a little, so it is off unless asked for, as in PyTorch.
    pub fn new(enable_timing: bool) -> Event {
        Event {
            enable_timing,
            state: Mutex::new(None),
        }
    }

    /// Whether the event was created with timing.
    pub fn enable_timing(&self) -> bool {
        self.enable_timing
    }

    /// `(device, raw CUevent)` once recorded.
    pub(crate) fn recorded(&self) -> Option<(usize, u64)> {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the event on the current stream of the current device (`Event.record()`).
    ///
    /// # Errors
    /// [`CudaError::Unavailable`], [`CudaError::DeviceMismatch`] (recorded before on another
    /// device), [`CudaError::Driver`].
    pub fn record(&self) -> Result<(), CudaError> {
        self.record_on(&current_stream_of_current_device()?)
    }

    /// Records the event on `stream` (`Event.record(stream)`): it completes when the work
    /// queued on `stream` so far has completed.
    ///
    /// # Errors
    /// As [`Event::record`].
    pub fn record_on(&self, stream: &Stream) -> Result<(), CudaError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let ev = match *state {
            Some((device, ev)) if device == stream.device() => ev,
            Some((device, _)) => {
                return Err(CudaError::DeviceMismatch {
                    op: "Event::record",
                    expected: device,
                    actual: stream.device(),
                })
            }
            None => {
                // From the pool (Note [Event pool]).
                let ev = crate::event_pool::take(stream.device(), self.enable_timing)?;
                *state = Some((stream.device(), ev));
                ev
            }
        };
        // SAFETY: `ev` is this event's live driver event, of `stream`'s device (checked above);
        // `stream` (borrowed) keeps its handle alive.
        unsafe { ffi::event_record(stream.device(), ev, stream.as_raw()) }
    }

    /// Makes `stream` wait for this event (`Event.wait(stream)`); the host does not wait.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn wait(&self, stream: &Stream) -> Result<(), CudaError> {
        stream.wait_event(self)
    }

    /// Whether the work captured by the last `record` has completed (`Event.query()`); `true`
    /// for an event never recorded.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn query(&self) -> Result<bool, CudaError> {
        match self.recorded() {
            // SAFETY: `self` owns the live driver event `ev`.
            Some((device, ev)) => unsafe { ffi::event_query(device, ev) },
            None => Ok(true),
        }
    }

    /// Blocks the host until the event has completed (`Event.synchronize()`). An explicit
    /// sync: counted, never reported by sync-debug mode.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn synchronize(&self) -> Result<(), CudaError> {
        match self.recorded() {
            Some((device, ev)) => {
                crate::sync_debug::count_host_wait();
                // SAFETY: `self` owns the live driver event `ev`.
                unsafe { ffi::event_sync(device, ev) }
            }
            None => Ok(()),
        }
    }

    /// [`Event::synchronize`] without counting a host wait (the caller counted one).
    pub(crate) fn synchronize_uncounted(&self) -> Result<(), CudaError> {
        match self.recorded() {
            // SAFETY: `self` owns the live driver event `ev`.
            Some((device, ev)) => unsafe { ffi::event_sync(device, ev) },
            None => Ok(()),
        }
    }

    /// Milliseconds between this event and `end` (`Event.elapsed_time(end)`).
    ///
    /// # Errors
    /// 1. [`CudaError::TimingDisabled`] when either event was created without timing
    ///    (PyTorch's message naming `enable_timing`).
    /// 2. [`CudaError::EventNotRecorded`] when either was never recorded.
    /// 3. [`CudaError::EventNotReady`] when either has not completed yet ("Both events must be
    ///    completed before calculating elapsed time."), instead of a garbage number or a hang.
    /// 4. [`CudaError::DeviceMismatch`] for events of two devices; [`CudaError::Driver`].
    pub fn elapsed_time(&self, end: &Event) -> Result<f32, CudaError> {
        if !self.enable_timing || !end.enable_timing {
            return Err(CudaError::TimingDisabled);
        }
        let (Some((d0, e0)), Some((d1, e1))) = (self.recorded(), end.recorded()) else {
            return Err(CudaError::EventNotRecorded);
        };
        if d0 != d1 {
            return Err(CudaError::DeviceMismatch {
                op: "Event::elapsed_time",
                expected: d0,
                actual: d1,
            });
        }
        // SAFETY: `self` and `end` own the live driver events `e0` and `e1`.
        if !unsafe { ffi::event_query(d0, e0)? } || !unsafe { ffi::event_query(d1, e1)? } {
            return Err(CudaError::EventNotReady);
        }
        // SAFETY: both events are live, of device `d0`, made with timing (checked above) and
        // completed (queried above).
        unsafe { ffi::event_elapsed(d0, e0, e1) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some((device, ev)) = self.recorded() {
            // SAFETY: `self` took `ev` from the pool for `device` with its timing flag, and
            // gives it back once, here (Note [Event pool]).
            unsafe { crate::event_pool::give(device, self.enable_timing, ev) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// <https://github.com/pytorch/pytorch/issues/85796>
    #[test]
    fn timing_disabled_is_checked_before_anything_else() {
        let a = Event::new(false);
        let b = Event::new(true);
        assert_eq!(a.elapsed_time(&b), Err(CudaError::TimingDisabled));
        assert_eq!(b.elapsed_time(&a), Err(CudaError::TimingDisabled));
    }

    #[test]
    fn unrecorded_events_are_complete_and_cannot_be_timed() {
        let a = Event::new(true);
        let b = Event::new(true);
        assert_eq!(a.query(), Ok(true));
        assert_eq!(a.synchronize(), Ok(()));
        assert_eq!(a.elapsed_time(&b), Err(CudaError::EventNotRecorded));
    }
}
