//! Peer access between two devices: whether one device can read and write another's memory
//! directly (over the link between them), and switching that on and off for berth's primary contexts.
//! PyTorch's `torch.cuda.can_device_access_peer` is [`can_access_peer`]; the rest follows the
//! driver's peer-access calls
//! (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html>).
//!
//! Every function takes `(device, peer)`: "work in `device`'s context accessing `peer`'s
//! memory". The pair is checked before the driver is touched: one device named twice is
//! [`CudaError::SameDevice`], an index past the visible devices [`CudaError::InvalidDevice`],
//! and no driver at all [`CudaError::Unavailable`] (never a panic).
//!
//! # Note [Peer access]
//! What the driver documents, and what berth makes of it
//! (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PEER__ACCESS.html>):
//!
//! 1. **Direction.** `cuCtxEnablePeerAccess(peer_ctx)` lets the *current* context access the
//!    allocations of `peer_ctx`; the grant is one-way, the other way needs its own call. berth
//!    always makes `device`'s primary context current and passes `peer`'s.
//! 2. **Idempotent answers.** Enabling twice answers `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`
//!    and disabling what is not enabled `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED`. Neither changes
//!    anything, so neither is an error here: [`enable_peer_access`] and
//!    [`disable_peer_access`] return whether access was enabled before the call.
//! 3. **Unsupported pairs.** When `cuDeviceCanAccessPeer` answers 0, enabling fails with
//!    `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`, which is [`CudaError::PeerAccessUnsupported`].
//!    Copies between such devices (`cuMemcpyPeerAsync`) still work; the driver stages them.
//! 4. **Shared state, no query.** The primary context is the CUDA runtime's too
//!    (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__PRIMARY__CTX.html>), so
//!    PyTorch's `cudaDeviceEnablePeerAccess`, NCCL's P2P transport and berth all change one
//!    state, and berth cannot know it by counting its own calls. The driver has no call that
//!    reads it, so [`peer_access_enabled`] asks by enabling: "already enabled" means it was on;
//!    a success means it was off, and it is disabled again at once. The probe may grant access
//!    for a moment but never takes it away from another user. It is not atomic: a thread that
//!    changes the same pair meanwhile races with it.
//! 5. **Which memory.** The grant covers `peer`'s `cuMemAlloc` memory. Memory mapped with
//!    `cuMemMap` (berth's `paged` and `expandable` policies, the default `paged` included) is
//!    accessible to the devices `cuMemSetAccess` names, which berth sets to the owning device
//!    only (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html>); PyTorch's
//!    expandable segments call `cuMemSetAccess` for each peer for that reason
//!    (`ExpandableSegment::addPeer` in `c10/cuda/CUDACachingAllocator.cpp`). berth does not
//!    yet: enabling peer access here does not open its policies' mapped memory to the peer.
//!    `berth bench p2p` therefore copies between `cuMemAlloc` buffers.

use crate::device::check_device;
use crate::driver::driver;
use crate::{ffi, CudaError};

/// Checks a `(device, peer)` pair before any driver call: two different devices, both
/// visible, and the driver present (fake device counts pass [`check_device`] without one).
fn check_pair(op: &'static str, device: usize, peer: usize) -> Result<(), CudaError> {
    if device == peer {
        return Err(CudaError::SameDevice { op, device });
    }
    check_device(device)?;
    check_device(peer)?;
    driver()?;
    Ok(())
}

/// Whether `device` can access `peer`'s memory directly (`cuDeviceCanAccessPeer`; PyTorch's
/// `torch.cuda.can_device_access_peer(device, peer)`). Says what the hardware and driver
/// allow, not whether access is enabled now ([`peer_access_enabled`]). Creates no context.
///
/// # Errors
/// [`CudaError::SameDevice`] when `device == peer`; [`CudaError::InvalidDevice`],
/// [`CudaError::Unavailable`], [`CudaError::Driver`].
pub fn can_access_peer(device: usize, peer: usize) -> Result<bool, CudaError> {
    check_pair("can_access_peer", device, peer)?;
    let dev = ffi::device_get(device)?;
    let peer_dev = ffi::device_get(peer)?;
    ffi::device_can_access_peer(device, dev, peer_dev)
}

/// Lets `device`'s primary context access `peer`'s memory directly (`cuCtxEnablePeerAccess`,
/// one way: `Note [Peer access]`, 1). Returns whether it was enabled already (then nothing
/// changed, `Note [Peer access]`, 2). Creates both devices' primary contexts.
///
/// # Errors
/// [`CudaError::SameDevice`], [`CudaError::InvalidDevice`], [`CudaError::Unavailable`];
/// [`CudaError::PeerAccessUnsupported`] when [`can_access_peer`] is `false`;
/// [`CudaError::Driver`] for other refusals (`CUDA_ERROR_TOO_MANY_PEERS`).
pub fn enable_peer_access(device: usize, peer: usize) -> Result<bool, CudaError> {
    check_pair("enable_peer_access", device, peer)?;
    ffi::ctx_enable_peer_access(device, peer)
}

/// Takes back `device`'s direct access to `peer`'s memory (`cuCtxDisablePeerAccess`). Returns
/// whether it was enabled before (when not, nothing changed, `Note [Peer access]`, 2). Creates
/// both devices' primary contexts.
///
/// Access is shared with every other user of the primary contexts (`Note [Peer access]`, 4):
/// disable only what this program enabled, or restore the state it found
/// ([`set_peer_access`] returns it).
///
/// # Errors
/// [`CudaError::SameDevice`], [`CudaError::InvalidDevice`], [`CudaError::Unavailable`],
/// [`CudaError::Driver`].
pub fn disable_peer_access(device: usize, peer: usize) -> Result<bool, CudaError> {
    check_pair("disable_peer_access", device, peer)?;
    ffi::ctx_disable_peer_access(device, peer)
}

/// Whether `device` can access `peer`'s memory directly right now. The driver has no query for
/// this, so it probes: it enables access and, when that call was the one to enable it,
/// disables it again (`Note [Peer access]`, 4). A pair that does not support peer access
/// answers `false`. Creates both devices' primary contexts.
///
/// # Errors
/// [`CudaError::SameDevice`], [`CudaError::InvalidDevice`], [`CudaError::Unavailable`],
/// [`CudaError::Driver`].
pub fn peer_access_enabled(device: usize, peer: usize) -> Result<bool, CudaError> {
    check_pair("peer_access_enabled", device, peer)?;
    match ffi::ctx_enable_peer_access(device, peer) {
        Ok(true) => Ok(true),
        Ok(false) => ffi::ctx_disable_peer_access(device, peer).map(|_| false),
        Err(CudaError::PeerAccessUnsupported { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Enables (`enabled = true`) or disables `device`'s direct access to `peer`'s memory; returns
/// the state before, so that a caller can put it back with a second call.
///
/// # Errors
/// As [`enable_peer_access`] or [`disable_peer_access`].
pub fn set_peer_access(device: usize, peer: usize, enabled: bool) -> Result<bool, CudaError> {
    if enabled {
        enable_peer_access(device, peer)
    } else {
        disable_peer_access(device, peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fake_device_count;

    /// Every function, for the pairs it refuses.
    fn each(device: usize, peer: usize) -> [Result<bool, CudaError>; 5] {
        [
            can_access_peer(device, peer),
            enable_peer_access(device, peer),
            disable_peer_access(device, peer),
            peer_access_enabled(device, peer),
            set_peer_access(device, peer, true),
        ]
    }

    /// One device named twice is refused before the driver, on any machine.
    #[test]
    fn the_same_device_twice_is_refused_by_name() {
        let ops = [
            "can_access_peer",
            "enable_peer_access",
            "disable_peer_access",
            "peer_access_enabled",
            "enable_peer_access",
        ];
        for (r, op) in each(3, 3).into_iter().zip(ops) {
            assert_eq!(r, Err(CudaError::SameDevice { op, device: 3 }));
        }
        assert_eq!(
            CudaError::SameDevice {
                op: "enable_peer_access",
                device: 3
            }
            .to_string(),
            "enable_peer_access: cuda:3 is both the device and its peer; name two different devices"
        );
    }

    /// An index past the visible devices is `InvalidDevice` with the index and the count,
    /// whichever side it is on; faked, so it runs without a driver.
    #[test]
    fn a_device_out_of_range_is_invalid_device() {
        let _g = fake_device_count(2);
        for r in each(0, 5) {
            assert_eq!(r, Err(CudaError::InvalidDevice { index: 5, count: 2 }));
        }
        for r in each(4, 1) {
            assert_eq!(r, Err(CudaError::InvalidDevice { index: 4, count: 2 }));
        }
    }

    /// Without a driver a valid-looking pair answers `Unavailable`, never a panic (a fake count
    /// lets the indices pass; the driver gate still stops the call).
    #[test]
    fn without_a_driver_a_valid_pair_is_unavailable() {
        if crate::is_available() {
            return;
        }
        let reason = crate::unavailable_reason().unwrap();
        let _g = fake_device_count(2);
        for r in each(0, 1).into_iter().chain(each(1, 0)) {
            assert_eq!(
                r,
                Err(CudaError::Unavailable {
                    reason: reason.clone()
                })
            );
        }
    }

    /// On a GPU machine the first index past the visible devices is refused as out of range
    /// (on one GPU: `can_access_peer(0, 1)`).
    #[test]
    #[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
    fn a_missing_peer_is_out_of_range_on_a_gpu() {
        if !crate::testing::require_gpu("a_missing_peer_is_out_of_range_on_a_gpu") {
            return;
        }
        let n = crate::device_count();
        for r in each(0, n) {
            assert_eq!(r, Err(CudaError::InvalidDevice { index: n, count: n }));
        }
    }

    /// Two GPUs, both directions: enabling, disabling and the probe agree, the idempotent
    /// answers say "no change", and the state found at the start is put back.
    #[test]
    #[ignore = "needs two CUDA GPUs: run with --include-ignored"]
    fn enable_disable_and_probe_agree_and_the_state_is_restored() {
        let name = "enable_disable_and_probe_agree_and_the_state_is_restored";
        if !crate::testing::require_gpus(name, 2) {
            return;
        }
        for (a, b) in [(0, 1), (1, 0)] {
            let can = can_access_peer(a, b).unwrap();
            let before = peer_access_enabled(a, b).unwrap();
            println!("cuda:{a} -> cuda:{b}: can access {can}, enabled at start {before}");
            if !can {
                assert!(!before);
                assert_eq!(
                    enable_peer_access(a, b),
                    Err(CudaError::PeerAccessUnsupported { device: a, peer: b })
                );
                continue;
            }
            assert_eq!(set_peer_access(a, b, true), Ok(before));
            assert_eq!(peer_access_enabled(a, b), Ok(true));
            assert_eq!(enable_peer_access(a, b), Ok(true), "already enabled");
            assert_eq!(disable_peer_access(a, b), Ok(true));
            assert_eq!(peer_access_enabled(a, b), Ok(false));
            assert_eq!(disable_peer_access(a, b), Ok(false), "not enabled");
            assert_eq!(set_peer_access(a, b, before), Ok(false));
            assert_eq!(peer_access_enabled(a, b), Ok(before));
        }
    }

    #[test]
    fn unsupported_message_names_both_devices() {
        assert_eq!(
            CudaError::PeerAccessUnsupported { device: 1, peer: 0 }.to_string(),
            "cuda:1 cannot access memory of cuda:0 directly (peer access is not supported \
             between them); copies between them still work without it"
        );
    }
}
