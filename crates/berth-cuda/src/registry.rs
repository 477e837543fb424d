//! [`PerDevice`]: one lazily built value per CUDA device, the one registry behind primary
//! contexts, device allocators and (in berth) the device generators and cuBLAS handles.
//!
//! A slot is built on the first request for its device, at most once, under one lock that
//! serialises construction only (reads of built slots take no lock). Asking whether a value
//! exists ([`PerDevice::get`]) never builds one, so statistics and `empty_cache` touch no
//! device the program did not use (PyTorch's lazy initialisation).

use std::sync::{Mutex, OnceLock};

use crate::driver::driver;
use crate::CudaError;

/// One lazily built `T` per visible CUDA device.
///
/// ```
/// use berth_cuda::registry::PerDevice;
/// static NAMES: PerDevice<String> = PerDevice::new();
/// // Without a driver there are no devices: nothing is built, the error says why.
/// if !berth_cuda::is_available() {
///     assert!(NAMES.get_or_try_init(0, |i| Ok(format!("cuda:{i}"))).is_err());
///     assert!(NAMES.get(0).is_none());
/// }
/// ```
pub struct PerDevice<T> {
    slots: OnceLock<Vec<OnceLock<T>>>,
    init: Mutex<()>,
}

impl<T> Default for PerDevice<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> PerDevice<T> {
    /// An empty registry (usable in a `static`).
    pub const fn new() -> Self {
        PerDevice {
            slots: OnceLock::new(),
            init: Mutex::new(()),
        }
    }

    fn slots(&self) -> Result<&[OnceLock<T>], CudaError> {
        let count = driver()?;
        Ok(self
            .slots
            .get_or_init(|| (0..count).map(|_| OnceLock::new()).collect()))
    }

    /// The value of `device`, built by `build(device)` on first use (at most once, even when
    /// several threads ask at the same time; a failed build leaves the slot empty for a retry).
    ///
    /// # Errors
    /// [`CudaError::Unavailable`] without a driver, [`CudaError::InvalidDevice`] for an index
    /// at or past the device count, or `build`'s error.
    pub fn get_or_try_init(
        &self,
        device: usize,
        build: impl FnOnce(usize) -> Result<T, CudaError>,
    ) -> Result<&T, CudaError> {
        let slots = self.slots()?;
        let slot = slots.get(device).ok_or(CudaError::InvalidDevice {
            index: device,
            count: slots.len(),
        })?;
        if let Some(v) = slot.get() {
            return Ok(v);
        }
        let _g = self.init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = slot.get() {
            return Ok(v);
        }
        let value = build(device)?;
        Ok(slot.get_or_init(|| value))
    }

    /// The value of `device` if it was built; never builds one (nor a context).
    pub fn get(&self, device: usize) -> Option<&T> {
        self.slots.get()?.get(device)?.get()
    }

    /// Every built value with its device index, in index order.
    pub fn built(&self) -> impl Iterator<Item = (usize, &T)> {
        self.slots
            .get()
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, s)| s.get().map(|v| (i, v)))
    }
}
