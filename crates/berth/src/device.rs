//! `Device`: where a tensor's memory lives, as a small `Copy` value (PyTorch's `c10::Device`).
//!
//! A device is only a *name* (kind + optional index). Parsing `"cuda:5"` always succeeds; using
//! it checks the index against the number of visible devices
//! (<https://github.com/pytorch/pytorch/issues/136849>). `"cuda"` without an
//! index means the thread's current CUDA device and is canonicalised to `cuda:<current>` when a
//! tensor is placed on it ([`Device::canonical`]).

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// The kind of a device (PyTorch's `DeviceType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DeviceKind {
    /// Host memory.
    Cpu,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
    /// Apple's Metal Performance Shaders: parses, never available in berth.
    Mps,
    /// The meta device: shapes and dtypes only, no memory (PyTorch's `meta`).
    Meta,
}

impl DeviceKind {
    /// The lowercase name used in device strings.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Mps => "mps",
            DeviceKind::Meta => "meta",
        }
    }
}

/// A device: a kind and an optional index (`cuda` vs `cuda:1`), as an enum a user can match. `Copy`.
///
/// Grammar (PyTorch's `c10/core/Device.cpp`): `([a-zA-Z_]+)(?::([1-9]\d*|0))?`, i.e. a type
/// and an optional index, a non-negative decimal without leading zeros. Accepted:
/// - `cuda` and `cuda:<index>` (any index; checked against the device count on use);
/// - `cpu`, `mps`, `meta`, and each with the index 0 (`cpu:0`, `mps:0`, `meta:0`), which
///   PyTorch accepts too (`torch.device("cpu:0")`). berth has a single device of each of
///   these kinds, so `cpu:0` parses to the same [`Device::Cpu`] as `cpu`; any other index
///   (`cpu:1`) is a [`ParseDeviceError`] saying to use `cpu` or `cpu:0`.
///
/// [`Display`](fmt::Display) writes the canonical form (`cpu`, `meta`, `mps`, `cuda`,
/// `cuda:1`), which parses back to the same device.
///
/// ```
/// use berth::Device;
/// let d: Device = "cuda:1".parse().unwrap();
/// assert_eq!(d, Device::Cuda(1));
/// assert_eq!(d.to_string(), "cuda:1");
/// assert_eq!("cpu:0".parse::<Device>().unwrap(), Device::Cpu);
/// assert_eq!(Device::Cpu.to_string(), "cpu");
/// assert!("cuda:-1".parse::<Device>().is_err());
/// assert!("cpu:1".parse::<Device>().is_err());
/// ```
///
/// A plain enum, so it can be matched (`#[non_exhaustive]`: PyTorch has more device kinds,
/// which later versions may add):
///
/// ```
/// use berth::Device;
/// fn describe(d: Device) -> String {
///     match d {
///         Device::Cpu => "host memory".into(),
///         Device::Cuda(i) => format!("GPU {i}"),
///         Device::CudaCurrent => "the current GPU".into(),
///         Device::Meta => "shapes only".into(),
///         _ => "not available here".into(), // mps, and kinds later versions add
///     }
/// }
/// assert_eq!(describe("cuda:1".parse().unwrap()), "GPU 1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Device {
    /// The host.
    Cpu,
    /// `cuda` without an index: the thread's current CUDA device, resolved on use
    /// ([`Device::canonical`]).
    CudaCurrent,
    /// CUDA device `index` (`cuda:<index>`). Not checked against the device count until used.
    Cuda(u16),
    /// Apple MPS: parses, but using it is a typed "not available on this platform" error.
    Mps,
    /// The meta device (no memory).
    Meta,
}

/// A device string that does not follow PyTorch's grammar, or names a device berth does not
/// have (`cpu:1`: berth has a single cpu, mps and meta device).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid device string {input:?}: {reason}; expected one of cpu, cuda, cuda:<index>, mps, \
     meta (cpu, mps and meta also accept the index 0, e.g. cpu:0; an index is a non-negative \
     decimal without leading zeros, e.g. cuda:0)"
)]
pub struct ParseDeviceError {
    /// The string that failed to parse.
    pub input: String,
    /// What was wrong with it.
    pub reason: String,
}

impl Device {
    /// A device from its parts, as parsing builds it: `Device::new(kind, index)` is the device
    /// `"<kind>:<index>".parse()` gives, so it displays in the canonical form and parses back.
    /// berth has a single cpu, mps and meta device: for them the index 0 gives the index-less
    /// device (`Device::new(DeviceKind::Cpu, Some(0)) == Device::Cpu`, as `"cpu:0"`); CUDA
    /// takes any index (checked against the device count on use).
    ///
    /// ```
    /// use berth::{Device, DeviceKind};
    /// assert_eq!(Device::new(DeviceKind::Cpu, Some(0)).unwrap(), Device::Cpu);
    /// assert_eq!(Device::new(DeviceKind::Cuda, Some(1)).unwrap(), Device::Cuda(1));
    /// assert!(Device::new(DeviceKind::Cpu, Some(1)).is_err());
    /// ```
    ///
    /// # Errors
    /// [`ParseDeviceError`] for cpu, mps or meta with an index other than 0 (`cpu:1` does not
    /// exist; use `cpu` or `cpu:0`), with the same message as parsing `"cpu:1"`.
    pub fn new(
        kind: DeviceKind,
        index: Option<u16>,
    ) -> std::result::Result<Device, ParseDeviceError> {
        let index = match (kind, index) {
            (DeviceKind::Cuda, i) | (_, i @ None) => i,
            // The one device of its kind: `cpu:0` is `cpu`, as `torch.device("cpu:0")`.
            (_, Some(0)) => None,
            (_, Some(i)) => {
                let name = kind.as_str();
                return Err(ParseDeviceError {
                    input: format!("{name}:{i}"),
                    reason: format!(
                        "berth has a single {name} device, so index {i} does not exist; use \
                         `{name}` or `{name}:0`"
                    ),
                });
            }
        };
        Ok(match (kind, index) {
            (DeviceKind::Cpu, _) => Device::Cpu,
            (DeviceKind::Cuda, Some(i)) => Device::Cuda(i),
            (DeviceKind::Cuda, None) => Device::CudaCurrent,
            (DeviceKind::Mps, _) => Device::Mps,
            (DeviceKind::Meta, _) => Device::Meta,
        })
    }

    /// The kind (`cpu`, `cuda`, ...).
    pub fn kind(self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::CudaCurrent | Device::Cuda(_) => DeviceKind::Cuda,
            Device::Mps => DeviceKind::Mps,
            Device::Meta => DeviceKind::Meta,
        }
    }

    /// The index, if one was given (`cuda:1` → `Some(1)`, `cuda` → `None`).
    pub fn index(self) -> Option<u16> {
        match self {
            Device::Cuda(i) => Some(i),
            _ => None,
        }
    }

    /// Whether this is the host.
    pub fn is_cpu(self) -> bool {
        self == Device::Cpu
    }

    /// Whether this is a CUDA device (with or without an index).
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_) | Device::CudaCurrent)
    }

    /// Whether this is the meta device.
    pub fn is_meta(self) -> bool {
        self == Device::Meta
    }

    /// `cuda:0` when CUDA is available, else `cpu`: PyTorch's one-`DEVICE`-variable idiom
    /// (`torch.device("cuda" if torch.cuda.is_available() else "cpu")`).
    pub fn best() -> Device {
        if crate::cuda::is_available() {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }
    }

    /// The device a tensor is placed on: `cuda` becomes `cuda:<current>`; everything else is
    /// returned as is. The index is checked against the device count and the platform checked.
    ///
    /// # Errors
    /// 1. `Error::Cuda(CudaError::InvalidDevice)` when `cuda:i` has `i ≥ device_count()`
    ///    ("device index 5 is out of range [0, 1)";
    ///    <https://github.com/pytorch/pytorch/issues/136849>).
    /// 2. `Error::Cuda(CudaError::Unavailable)` when CUDA is not available at all.
    /// 3. [`Error::DeviceNotAvailable`] for `mps` (not available on this platform).
    pub fn canonical(self) -> Result<Device> {
        match self.kind() {
            DeviceKind::Cpu | DeviceKind::Meta => Ok(self),
            DeviceKind::Mps => Err(Error::DeviceNotAvailable {
                device: self,
                reason: "MPS is Apple's Metal backend, which berth does not drive (its \
                         devices are cpu, cuda and meta)"
                    .into(),
            }),
            DeviceKind::Cuda => {
                let index = match self.index() {
                    Some(i) => usize::from(i),
                    None => crate::cuda::current_device()?,
                };
                crate::cuda::check_device(index)?;
                Ok(Device::Cuda(index as u16))
            }
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index() {
            Some(i) => write!(f, "{}:{}", self.kind().as_str(), i),
            None => f.write_str(self.kind().as_str()),
        }
    }
}

impl FromStr for Device {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let err = |reason: &str| ParseDeviceError {
            input: s.to_string(),
            reason: reason.into(),
        };
        let (name, index) = match s.split_once(':') {
            Some((n, i)) => (n, Some(i)),
            None => (s, None),
        };
        if name.is_empty() {
            return Err(err("the device type is empty"));
        }
        if !name.chars().all(|c| c.is_ascii_alphabetic() || c == '_') {
            return Err(err("the device type may contain only letters and '_'"));
        }
        let kind = match name {
            "cpu" => DeviceKind::Cpu,
            "cuda" => DeviceKind::Cuda,
            "mps" => DeviceKind::Mps,
            "meta" => DeviceKind::Meta,
            _ => return Err(err(&format!("unknown device type {name:?}"))),
        };
        let index = match index {
            None => None,
            Some("") => return Err(err("the index after ':' is empty")),
            Some(i) => {
                if !i.chars().all(|c| c.is_ascii_digit()) {
                    return Err(err(&format!(
                        "the index {i:?} is not a non-negative decimal"
                    )));
                }
                if i.len() > 1 && i.starts_with('0') {
                    return Err(err(&format!("the index {i:?} has a leading zero")));
                }
                let v: u16 = i
                    .parse()
                    .map_err(|_| err(&format!("the index {i} is larger than {}", u16::MAX)))?;
                Some(v)
            }
        };
        // The same rules as `Device::new` (cpu:0 is cpu; cpu:1 does not exist), with `s` as
        // the input named by the error.
        Device::new(kind, index).map_err(|e| ParseDeviceError {
            input: s.to_string(),
            reason: e.reason,
        })
    }
}

impl TryFrom<&str> for Device {
    type Error = ParseDeviceError;
    fn try_from(s: &str) -> std::result::Result<Self, Self::Error> {
        s.parse()
    }
}

/// A `Device` names the device of the CUDA memory functions as in PyTorch
/// (`torch.cuda.memory_allocated(torch.device("cuda:1"))`): `cuda:i` is `i`, `cuda` the
/// thread's current device, and any other kind is [`CudaError::NotCuda`](crate::cuda::CudaError::NotCuda).
///
/// ```
/// use berth::Device;
/// let err = berth::cuda::memory_allocated(Device::Cpu).unwrap_err();
/// assert_eq!(err.to_string(), "Expected a cuda device, but got: cpu");
/// ```
impl crate::cuda::CudaDeviceArg for Device {
    fn cuda_index(self) -> std::result::Result<usize, crate::cuda::CudaError> {
        match self {
            Device::Cuda(i) => Ok(usize::from(i)),
            Device::CudaCurrent => crate::cuda::current_device(),
            other => Err(crate::cuda::CudaError::NotCuda {
                device: other.to_string(),
            }),
        }
    }
}
