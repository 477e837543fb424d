//! `berth train`'s up-front memory check: what the model needs, against what the device has.
//!
//! Newcomer defect 7: `berth train --hidden 4000000` passed every check, then was killed by the
//! OOM killer at 24 GB after 106 s. The run now says before it starts what training needs,
//! in bytes, and refuses what cannot fit in the device's memory (host RAM for `cpu`).

use berth::Device;

use super::mlp::{CLASSES, INPUTS};
use crate::UsageError;

/// Bytes of f32 one training run holds at least, in bytes: the parameters of the MLP
/// (784 → hidden → 10), their gradients and momentum buffers (three copies), and one batch's
/// activations (the input, the hidden layer before and after `ReLU` and its gradient, the
/// logits and theirs). `None` when that overflows a `u64`. A lower bound: the allocator's
/// rounding, caching and the data set come on top.
pub fn training_bytes(hidden: usize, batch_size: usize) -> Option<u64> {
    let (h, b) = (hidden as u64, batch_size as u64);
    let inputs = INPUTS as u64;
    let classes = CLASSES as u64;
    let params = h
        .checked_mul(inputs)?
        .checked_add(h)?
        .checked_add(h.checked_mul(classes)?)?
        .checked_add(classes)?;
    let activations = b.checked_mul(
        inputs
            .checked_add(h.checked_mul(3)?)?
            .checked_add(2 * classes)?,
    )?;
    params
        .checked_mul(3)?
        .checked_add(activations)?
        .checked_mul(4)
}

/// The memory training on `device` may use, in bytes, and what it is: `MemAvailable` of
/// `/proc/meminfo` for the CPU, the device's total for CUDA; `None` when it cannot be read
/// (no check then).
fn device_memory(device: Device) -> Option<(u64, String)> {
    if device.is_cuda() {
        let index = device.index().unwrap_or(0);
        let (_, total) = berth::cuda::mem_get_info(usize::from(index)).ok()?;
        return Some((total as u64, format!("{device}'s total memory")));
    }
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((
        kib.checked_mul(1024)?,
        "the host memory available (MemAvailable)".into(),
    ))
}

/// Refuses a `--hidden` / `--batch-size` whose [`training_bytes`] exceed what `device` has.
///
/// # Errors
/// A [`UsageError`] saying how many bytes training needs, how many the device has, and the
/// largest `--hidden` that would fit.
pub fn check_fits(hidden: usize, batch_size: usize, device: Device) -> Result<(), UsageError> {
    let Some((have, what)) = device_memory(device) else {
        return Ok(());
    };
    check_fits_in(hidden, batch_size, device, have, &what)
}

/// [`check_fits`] against `have` bytes of memory described as `what`.
pub fn check_fits_in(
    hidden: usize,
    batch_size: usize,
    device: Device,
    have: u64,
    what: &str,
) -> Result<(), UsageError> {
    let need = training_bytes(hidden, batch_size);
    if need.is_some_and(|n| n <= have) {
        return Ok(());
    }
    // The largest width that fits: `training_bytes` grows with `hidden`, so bisect.
    let (mut lo, mut hi) = (0usize, hidden);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if training_bytes(mid, batch_size).is_some_and(|n| n <= have) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let need = need.map_or_else(
        || "more than 2^64 bytes".to_owned(),
        |n| {
            format!(
                "at least {n} bytes ({})",
                berth_alloc::stats::format_size(n)
            )
        },
    );
    let advice = if lo == 0 {
        format!("even --hidden 1 does not fit with --batch-size {batch_size}; use a smaller --batch-size")
    } else {
        format!("use --hidden {lo} or less (e.g. --hidden 256)")
    };
    Err(UsageError(format!(
        "--hidden {hidden} with --batch-size {batch_size}: training on {device} needs {need} \
         (the MLP's parameters, their gradients and momentum buffers, and one batch's \
         activations, as f32), more than {what}: {have} bytes ({}); {advice}",
        berth_alloc::stats::format_size(have),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_bytes_counts_three_copies_of_the_parameters_and_one_batch() {
        // hidden 256: 203,530 parameters; batch 64: 64 × (784 + 768 + 20) activations.
        let params = 256 * 784 + 256 + 256 * 10 + 10;
        assert_eq!(params, 203_530);
        assert_eq!(
            training_bytes(256, 64),
            Some(4 * (3 * params + 64 * (784 + 3 * 256 + 20)))
        );
        assert_eq!(training_bytes(usize::MAX, 1), None);
    }

    #[test]
    fn the_newcomers_hidden_width_is_refused_up_front_with_the_bytes_it_needs() {
        // --hidden 4000000 was killed at 24 GB; on a host with 16 GiB available it is refused.
        let have = 16u64 << 30;
        let e = check_fits_in(
            4_000_000,
            64,
            Device::Cpu,
            have,
            "the host memory available",
        )
        .unwrap_err();
        let need = training_bytes(4_000_000, 64).unwrap();
        assert_eq!(need, 41_232_205_944);
        assert!(
            e.0.contains(&format!("training on cpu needs at least {need} bytes")),
            "{e}"
        );
        assert!(
            e.0.contains("more than the host memory available: 17179869184 bytes"),
            "{e}"
        );
        // The largest width that fits is named, and does fit.
        let lo: usize =
            e.0.split("use --hidden ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
        assert!(training_bytes(lo, 64).unwrap() <= have);
        assert!(training_bytes(lo + 1, 64).unwrap() > have);
        assert!(check_fits_in(256, 64, Device::Cpu, have, "x").is_ok());
    }
}
