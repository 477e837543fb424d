//! `berth bench p2p`: device-to-device copy bandwidth on each GPU, and peer copy bandwidth
//! (`cuMemcpyPeerAsync`) for every ordered pair of GPUs, with peer access disabled and
//! enabled.
//!
//! For the pair `cuda:s -> cuda:d` the bench switches peer access both ways (`d` accessing
//! `s` and `s` accessing `d`), as CUDA's `p2pBandwidthLatencyTest` sample does for its
//! "P2P=Disabled" and "P2P=Enabled" matrices
//! (<https://github.com/NVIDIA/cuda-samples/tree/master/Samples/5_Domain_Specific/p2pBandwidthLatencyTest>).
//! Disabled, the copy is staged through host memory; enabled, it goes directly over the link
//! between the GPUs (CUDA C++ Programming Guide, "Peer-to-Peer Memory Copy":
//! <https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#peer-to-peer-memory-copy>).
//! The state each pair had before (read with [`berth_cuda::peer::peer_access_enabled`]) is put
//! back after its rows, and read again to report that it was. The copies run between
//! `cuMemAlloc` buffers, to which peer access applies (`Note [Peer access]` in
//! `berth_cuda::peer`, 5).
//!
//! Bandwidths are GB/s (10⁹ bytes per second) of the copied bytes, from CUDA events on the
//! destination's stream, median of `--reps` after one warm-up.

use berth::alloc::{DevicePtr, MemoryBackend, StreamId};
use berth::cuda::{self, CudaBackend, Stream};
use berth::{DType, Device, Tensor};
use berth_cuda::peer;

use super::gpu::{check_reps, emit, gbps, require_gpu, time_events};

/// `berth bench p2p --help`: what each row measures (on the subcommand in `bench/mod.rs`).
pub(super) const LONG_ABOUT: &str = concat!(
    "Copy bandwidth on each GPU and between GPUs, in GB/s (10^9 bytes/s), the median of --reps\n",
    "after a warm-up.\n",
    "\n",
    "Rows:\n",
    "  device to device on cuda:N, M MiB (read + write)\n",
    "      cuMemcpyDtoDAsync within one GPU, one row per GPU: all that one GPU can measure.\n",
    "  peer copy cuda:S -> cuda:D, M MiB, peer access disabled\n",
    "      cuMemcpyPeerAsync with peer access off both ways: staged through host memory.\n",
    "  peer copy cuda:S -> cuda:D, M MiB, peer access enabled\n",
    "      the same with peer access on both ways: direct over NVLink or PCIe. Left out, with a\n",
    "      line saying so, when cuDeviceCanAccessPeer answers 0 for the pair.\n",
    "\n",
    "Each pair's peer-access state is read before its rows and put back after them (a line per\n",
    "pair reports both). With one GPU the peer rows are skipped with a line saying that they\n",
    "need two GPUs. --json prints one JSON object per line with the same figures; peer rows add\n",
    "src, dst, peer_access and can_access_peer.",
);

/// Arguments of `berth bench p2p`.
#[derive(clap::Args, Debug)]
pub struct P2pArgs {
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
    /// Repetitions per figure (the median is reported); at least 1.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--reps", "the number of repetitions", 1, 10))]
    pub reps: usize,
    /// Copy size in MiB (1 GiB by default, as PyTorch's reference figure).
    #[arg(long, default_value_t = 1024, value_parser = crate::whole_usize("--mib", "a size in MiB", 1, 1024))]
    pub mib: usize,
}

/// Peer access of one ordered pair `s -> d`, both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
struct PairAccess {
    /// `d` accesses `s`'s memory.
    dst_accesses_src: bool,
    /// `s` accesses `d`'s memory.
    src_accesses_dst: bool,
}

impl PairAccess {
    fn read(s: usize, d: usize) -> Result<PairAccess, cuda::CudaError> {
        Ok(PairAccess {
            dst_accesses_src: peer::peer_access_enabled(d, s)?,
            src_accesses_dst: peer::peer_access_enabled(s, d)?,
        })
    }

    /// Sets both ways as `self` says.
    fn apply(self, s: usize, d: usize) -> Result<(), cuda::CudaError> {
        peer::set_peer_access(d, s, self.dst_accesses_src)?;
        peer::set_peer_access(s, d, self.src_accesses_dst)?;
        Ok(())
    }

    fn both(on: bool) -> PairAccess {
        PairAccess {
            dst_accesses_src: on,
            src_accesses_dst: on,
        }
    }

    fn words(self) -> String {
        let w = |b: bool| if b { "on" } else { "off" };
        format!("{}/{}", w(self.dst_accesses_src), w(self.src_accesses_dst))
    }
}

/// A line that is not a figure: `# text` in text mode, `{"bench": "p2p", key: text, ...}` in
/// JSON mode (so a reader of the JSON lines sees it too).
fn note(json: bool, key: &str, text: String, extra: serde_json::Value) {
    if json {
        let mut v = serde_json::json!({ "bench": "p2p", key: text });
        if let (Some(o), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        println!("{v}");
    } else {
        println!("# {text}");
    }
}

/// Runs `berth bench p2p`.
pub fn run_p2p(a: P2pArgs) -> anyhow::Result<()> {
    check_reps(a.reps)?;
    require_gpu()?;
    let count = cuda::device_count();
    let bytes = a.mib * (1 << 20);
    for d in 0..count {
        let stream = Stream::new(d, 0)?;
        let src = Tensor::zeros(&[bytes / 4], DType::F32, Device::Cuda(d as u16))?;
        let dst = Tensor::zeros(&[bytes / 4], DType::F32, Device::Cuda(d as u16))?;
        let ms = time_events(&stream, a.reps, || {
            // SAFETY: both tensors hold `bytes` bytes on device `d` and outlive the copy
            // (time_events synchronises); nothing else uses them.
            unsafe { cuda::transfer::copy_dtod_raw(d, dst.data_ptr(), src.data_ptr(), bytes)? };
            Ok(())
        })?;
        emit(
            a.json,
            "p2p",
            format!("device to device on cuda:{d}, {} MiB (read + write)", a.mib),
            gbps(bytes, ms),
            "GB/s",
        );
    }
    if count < 2 {
        note(
            a.json,
            "skipped",
            format!(
                "peer copies need two GPUs; {count} visible: only the device-to-device row was measured"
            ),
            serde_json::json!({ "visible_gpus": count }),
        );
        return Ok(());
    }
    // One `cuMemAlloc` buffer per device (Note [Peer access], 5), source or destination
    // depending on the pair; freed whatever the outcome.
    let backends = (0..count)
        .map(CudaBackend::new)
        .collect::<Result<Vec<_>, _>>()?;
    let mut buffers: Vec<DevicePtr> = Vec::with_capacity(count);
    let measured = (|| -> anyhow::Result<()> {
        for b in &backends {
            buffers.push(b.malloc(bytes, StreamId::DEFAULT)?);
        }
        for s in 0..count {
            for d in (0..count).filter(|&d| d != s) {
                peer_pair(&a, s, d, buffers[s].0, buffers[d].0)?;
            }
        }
        Ok(())
    })();
    let mut freed = Ok(());
    for (b, p) in backends.iter().zip(&buffers) {
        // SAFETY: `p` came from this backend's `malloc` with `bytes` bytes and is freed once;
        // every copy on it was waited for (time_events synchronises).
        let r = unsafe { b.free(*p, bytes, StreamId::DEFAULT) };
        freed = freed.and(r);
    }
    measured?;
    Ok(freed?)
}

/// The rows of `cuda:s -> cuda:d`: the copy with peer access disabled, then enabled (when the
/// pair supports it), then the state found before is put back and reported.
fn peer_pair(a: &P2pArgs, s: usize, d: usize, src: u64, dst: u64) -> anyhow::Result<()> {
    let bytes = a.mib * (1 << 20);
    let can = peer::can_access_peer(d, s)? && peer::can_access_peer(s, d)?;
    let before = PairAccess::read(s, d)?;
    let stream = Stream::new(d, 0)?;
    cuda::synchronize(s)?;
    cuda::synchronize(d)?;
    let measured = (|| -> anyhow::Result<()> {
        for on in [false, true] {
            let label = format!(
                "peer copy cuda:{s} -> cuda:{d}, {} MiB, peer access {}",
                a.mib,
                if on { "enabled" } else { "disabled" }
            );
            if on && !can {
                note(
                    a.json,
                    "skipped",
                    format!("{label}: cuDeviceCanAccessPeer answers 0 for this pair"),
                    serde_json::json!({ "src": s, "dst": d, "peer_access": true, "can_access_peer": false }),
                );
                continue;
            }
            PairAccess::both(on).apply(s, d)?;
            let ms = time_events(&stream, a.reps, || {
                // SAFETY: `src` (on `s`) and `dst` (on `d`) are live `cuMemAlloc` buffers of
                // `bytes` bytes each, freed only after this pair (time_events synchronises);
                // nothing else writes them.
                unsafe { berth_cuda::copy::copy_peer_async(dst, s, src, bytes, &stream)? };
                Ok(())
            })?;
            let value = gbps(bytes, ms);
            if a.json {
                let row = serde_json::json!({
                    "bench": "p2p", "figure": label, "value": value, "unit": "GB/s",
                    "src": s, "dst": d, "peer_access": on, "can_access_peer": can,
                });
                println!("{row}");
            } else {
                emit(false, "p2p", label, value, "GB/s");
            }
        }
        Ok(())
    })();
    let restored = before.apply(s, d);
    measured?;
    restored?;
    let after = PairAccess::read(s, d)?;
    let text = format!(
        "cuda:{s} -> cuda:{d}: cuDeviceCanAccessPeer {} both ways; peer access \
         (cuda:{d} to cuda:{s} / cuda:{s} to cuda:{d}) before {}, after {}",
        if can {
            "1"
        } else {
            "0 at least one way, not 1"
        },
        before.words(),
        after.words()
    );
    note(
        a.json,
        "pair",
        text,
        serde_json::json!({
            "src": s, "dst": d, "can_access_peer": can,
            "peer_access_before": before, "peer_access_after": after,
        }),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::PairAccess;

    /// The pair line's JSON fields and text, which `tests/bench.rs` and readers rely on.
    #[test]
    fn pair_access_reads_the_same_in_json_and_text() {
        let a = PairAccess {
            dst_accesses_src: true,
            src_accesses_dst: false,
        };
        assert_eq!(
            serde_json::to_value(a).unwrap(),
            serde_json::json!({ "dst_accesses_src": true, "src_accesses_dst": false })
        );
        assert_eq!(a.words(), "on/off");
        assert_eq!(PairAccess::both(false).words(), "off/off");
        assert_eq!(
            PairAccess::both(true),
            PairAccess {
                dst_accesses_src: true,
                src_accesses_dst: true
            }
        );
    }
}
