//! `berth train --devices`: the list of devices of a data-parallel run, one rank per entry,
//! checked up front with a typed error that says what was wrong and what would be right.

use berth::Device;

/// What is wrong with a `--devices` list. Each message names the list, the entry at fault and
/// a list that would work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DevicesError {
    /// No device at all.
    #[error("--devices {spec:?}: no device given; list one device per rank, e.g. --devices cuda:0,cuda:1 (or --devices cpu,cpu without a GPU)")]
    Empty {
        /// The value given.
        spec: String,
    },
    /// An entry between two commas is empty.
    #[error("--devices {spec}: entry {position} is empty; separate devices with single commas, e.g. --devices cuda:0,cuda:1")]
    EmptyEntry {
        /// The value given.
        spec: String,
        /// 1-based position of the empty entry.
        position: usize,
    },
    /// An entry is not a device.
    #[error("--devices {spec}: `{entry}` is not a device ({message}); use cpu or cuda:N, e.g. --devices cuda:0,cuda:1")]
    NotADevice {
        /// The value given.
        spec: String,
        /// The entry.
        entry: String,
        /// The parser's reason.
        message: String,
    },
    /// `cuda` without an index.
    #[error("--devices {spec}: `cuda` names no particular GPU; give each rank's index, e.g. --devices cuda:0,cuda:1")]
    NoIndex {
        /// The value given.
        spec: String,
    },
    /// A device kind that cannot train (meta).
    #[error("--devices {spec}: {device} holds no data and cannot train a rank; use cpu or cuda:N devices (for a memory prediction use --device meta)")]
    Unsupported {
        /// The value given.
        spec: String,
        /// The device.
        device: Device,
    },
    /// CPU and CUDA devices in one list.
    #[error("--devices {spec}: mixes cpu and cuda; every rank uses the same kind of device, e.g. --devices cuda:0,cuda:1 or --devices cpu,cpu")]
    Mixed {
        /// The value given.
        spec: String,
    },
    /// A GPU listed twice.
    #[error("--devices {spec}: {device} is listed twice; each rank needs a GPU of its own, e.g. --devices {suggestion}")]
    Duplicate {
        /// The value given.
        spec: String,
        /// The repeated device.
        device: Device,
        /// A list without repeats.
        suggestion: String,
    },
    /// A GPU index beyond the devices present.
    #[error(
        "--devices {spec}: {device} does not exist; this machine has {count} CUDA device(s){range}"
    )]
    OutOfRange {
        /// The value given.
        spec: String,
        /// The device.
        device: Device,
        /// The number of CUDA devices present.
        count: usize,
        /// The valid range in words (empty when there is none).
        range: String,
    },
    /// CUDA cannot be used at all.
    #[error("--devices {spec}: CUDA is not available ({reason}); use --devices cpu,cpu to run the data-parallel path on the CPU")]
    CudaUnavailable {
        /// The value given.
        spec: String,
        /// Why.
        reason: String,
    },
}

/// Parses and checks a `--devices` list against the CUDA devices present: `cuda` is
/// `Ok(count)` or `Err(reason)` when CUDA cannot be used. Every entry is `cpu` (which may
/// repeat: several CPU ranks) or `cuda:N` (each at most once, `N < count`); kinds are not
/// mixed.
///
/// # Errors
/// A [`DevicesError`] for the first problem found.
pub fn parse_devices(spec: &str, cuda: Result<usize, String>) -> Result<Vec<Device>, DevicesError> {
    let s = spec.to_owned();
    if spec.trim().is_empty() {
        return Err(DevicesError::Empty { spec: s });
    }
    let mut devices: Vec<Device> = Vec::new();
    for (i, entry) in spec.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(DevicesError::EmptyEntry {
                spec: s,
                position: i + 1,
            });
        }
        let d: Device =
            entry
                .parse()
                .map_err(|e: berth::ParseDeviceError| DevicesError::NotADevice {
                    spec: s.clone(),
                    entry: entry.to_owned(),
                    message: e.to_string(),
                })?;
        if d.is_meta() || !(d.is_cpu() || d.is_cuda()) {
            return Err(DevicesError::Unsupported { spec: s, device: d });
        }
        if d.is_cuda() && d.index().is_none() {
            return Err(DevicesError::NoIndex { spec: s });
        }
        devices.push(d);
    }
    if devices.iter().any(|d| d.is_cpu()) && devices.iter().any(|d| d.is_cuda()) {
        return Err(DevicesError::Mixed { spec: s });
    }
    for (i, d) in devices.iter().enumerate() {
        if d.is_cuda() && devices[..i].contains(d) {
            let suggestion = (0..devices.len())
                .map(|k| format!("cuda:{k}"))
                .collect::<Vec<_>>()
                .join(",");
            return Err(DevicesError::Duplicate {
                spec: s,
                device: *d,
                suggestion,
            });
        }
    }
    if devices[0].is_cuda() {
        let count = cuda.map_err(|reason| DevicesError::CudaUnavailable {
            spec: s.clone(),
            reason,
        })?;
        if let Some(d) = devices
            .iter()
            .find(|d| d.index().is_some_and(|i| usize::from(i) >= count))
        {
            let range = match count {
                0 => String::new(),
                1 => " (cuda:0)".to_owned(),
                n => format!(" (cuda:0 to cuda:{})", n - 1),
            };
            return Err(DevicesError::OutOfRange {
                spec: s,
                device: *d,
                count,
                range,
            });
        }
    }
    Ok(devices)
}

/// [`parse_devices`] against this machine's CUDA devices.
///
/// # Errors
/// As [`parse_devices`].
pub fn resolve_devices(spec: &str) -> Result<Vec<Device>, DevicesError> {
    let cuda = match berth::cuda::unavailable_reason() {
        None => Ok(berth::cuda::device_count()),
        Some(reason) => Err(reason),
    };
    parse_devices(spec, cuda)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Result<usize, String> {
        Ok(2)
    }

    #[test]
    fn good_lists_parse_in_order() {
        assert_eq!(
            parse_devices("cuda:1,cuda:0", two()),
            Ok(vec![Device::Cuda(1), Device::Cuda(0)])
        );
        assert_eq!(
            parse_devices("cpu, cpu", Err("no driver".into())),
            Ok(vec![Device::Cpu, Device::Cpu])
        );
        assert_eq!(parse_devices("cuda:0", two()), Ok(vec![Device::Cuda(0)]));
    }

    #[test]
    fn bad_lists_are_typed_errors_naming_the_fix() {
        let cases: [(&str, Result<usize, String>, &str); 9] = [
            ("", two(), "no device given"),
            ("cuda:0,,cuda:1", two(), "entry 2 is empty"),
            ("cuda:0,cuda:0", two(), "cuda:0 is listed twice; each rank needs a GPU of its own, e.g. --devices cuda:0,cuda:1"),
            ("cpu,cuda:0", two(), "mixes cpu and cuda"),
            ("cuda:0,cuda:2", two(), "cuda:2 does not exist; this machine has 2 CUDA device(s) (cuda:0 to cuda:1)"),
            ("gpu0", two(), "`gpu0` is not a device"),
            ("cuda,cuda", two(), "`cuda` names no particular GPU"),
            ("meta", two(), "meta holds no data"),
            ("cuda:0", Err("libcuda.so not found".into()), "CUDA is not available (libcuda.so not found); use --devices cpu,cpu"),
        ];
        for (spec, cuda, needle) in cases {
            let e = parse_devices(spec, cuda).unwrap_err();
            assert!(e.to_string().contains(needle), "{spec}: {e}");
        }
        assert!(matches!(
            parse_devices("cuda:0,cuda:0", two()),
            Err(DevicesError::Duplicate {
                device: Device::Cuda(0),
                ..
            })
        ));
        assert!(matches!(
            parse_devices("cuda:3", Ok(0)),
            Err(DevicesError::OutOfRange { count: 0, .. })
        ));
    }
}
