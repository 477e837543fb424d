//! Sharing device memory mapped through CUDA's virtual memory (the `expandable` and `paged`
//! policies) with another process: what `torch.multiprocessing` does with a CUDA tensor.
//!
//! # Note [Sharing mapped memory]
//! Memory from `cuMemAlloc` is shared with `cudaIpcGetMemHandle`; memory that a policy mapped
//! with `cuMemCreate` / `cuMemMap` is not, and PyTorch's expandable segments share theirs by
//! exporting each physical handle as a POSIX file descriptor
//! (`cuMemExportToShareableHandle`, <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html>)
//! which the receiving process takes with `pidfd_getfd`. berth does the same, for mappings of
//! any size (`paged` maps units of up to 32 MiB, not PyTorch's fixed pages):
//!
//! 1. Handles are created exportable (`cuMemCreate` is asked for
//!    `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, falling back to plain handles, which cannot be
//!    shared, where the driver refuses).
//! 2. [`share`] takes the whole mappings under a range (a block always lies in adjacent
//!    mappings), exports each once and keeps its descriptor open in this process until the
//!    mapping is unmapped: the receiver copies the descriptor out of this process, so it must
//!    still be open then. The same range shares to the same bytes every time, so a receiver
//!    that caches by handle (PyTorch does) maps it once.
//! 3. The handle ([`SharedRange`]) carries this process's id and, per mapping, its offset, size
//!    and descriptor number. [`open`] copies each descriptor (`pidfd_getfd`), imports it
//!    (`cuMemImportFromShareableHandle`), maps the handles side by side in a new reservation
//!    and sets read/write access for its device; dropping the [`OpenedRange`] unmaps, releases
//!    and frees all of it. The physical memory lives until both processes released it, as with
//!    `cudaIpcOpenMemHandle`: the sender may unmap its side first.
//! 4. Failures are errors, never a hang: a sender that exited, or kernel rules that forbid
//!    taking its descriptors (`pidfd_getfd` needs the right to ptrace the sender: same user,
//!    and Yama's `ptrace_scope` 0 unless the sender is the receiver's descendant), are
//!    [`CudaError::Ipc`] naming the cause and the way out (the `pytorch` policy's
//!    `cuMemAlloc` memory needs no descriptors).

use crate::{ffi, CudaError};

/// The format of [`SharedRange::to_bytes`]: bumped when the layout changes.
const FORMAT: u32 = 1;

/// One mapping of a shared range: `bytes` bytes at `offset` from the range's start, exported
/// as descriptor `fd` of the sending process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedMapping {
    /// Offset from the start of the range, in bytes.
    pub offset: u64,
    /// Size in bytes (a multiple of the device's granularity).
    pub bytes: u64,
    /// The descriptor's number in the sending process.
    pub fd: i32,
}

/// What another process needs to map a range of this one's device memory
/// (`Note [Sharing mapped memory]`): the sender's process id and its mappings, adjacent, from
/// offset 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRange {
    /// The sending process.
    pub pid: i32,
    /// The mappings, in address order, each starting where the previous ends.
    pub mappings: Vec<SharedMapping>,
}

impl SharedRange {
    /// The range's length in bytes.
    pub fn bytes(&self) -> u64 {
        self.mappings.iter().map(|m| m.bytes).sum()
    }

    /// The range as bytes, little-endian: format (u32), pid (i32), count (u32), then per
    /// mapping offset (u64), bytes (u64), fd (i32).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + 20 * self.mappings.len());
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&(self.mappings.len() as u32).to_le_bytes());
        for m in &self.mappings {
            out.extend_from_slice(&m.offset.to_le_bytes());
            out.extend_from_slice(&m.bytes.to_le_bytes());
            out.extend_from_slice(&m.fd.to_le_bytes());
        }
        out
    }

    /// Reads what [`to_bytes`](Self::to_bytes) wrote.
    ///
    /// # Errors
    /// [`CudaError::InvalidArgument`] for another format, a wrong length, no mappings, or
    /// mappings that are empty or not adjacent from offset 0.
    pub fn from_bytes(b: &[u8]) -> Result<SharedRange, CudaError> {
        let bad = |what: String| CudaError::InvalidArgument {
            op: "open shared memory",
            what,
        };
        let u32_at = |i: usize| {
            b.get(i..i + 4)
                .map(|s| u32::from_le_bytes(s.try_into().unwrap_or_default()))
        };
        let (Some(format), Some(pid), Some(count)) = (u32_at(0), u32_at(4), u32_at(8)) else {
            return Err(bad(format!(
                "the handle has {} bytes, fewer than its 12-byte header",
                b.len()
            )));
        };
        if format != FORMAT {
            return Err(bad(format!(
                "the handle is of format {format}; this berth reads format {FORMAT} (send and receive with the same berth)"
            )));
        }
        let want = 12 + 20 * count as usize;
        if count == 0 || b.len() != want {
            return Err(bad(format!(
                "the handle has {} bytes for {count} mappings; it needs at least one mapping and {want} bytes",
                b.len()
            )));
        }
        let mut mappings = Vec::with_capacity(count as usize);
        let mut next = 0u64;
        for i in 0..count as usize {
            let at = 12 + 20 * i;
            let u64_at = |j: usize| u64::from_le_bytes(b[j..j + 8].try_into().unwrap_or_default());
            let m = SharedMapping {
                offset: u64_at(at),
                bytes: u64_at(at + 8),
                fd: i32::from_le_bytes(b[at + 16..at + 20].try_into().unwrap_or_default()),
            };
            if m.offset != next || m.bytes == 0 {
                return Err(bad(format!(
                    "mapping {i} is {} bytes at offset {}; mappings must be non-empty and adjacent from offset 0 (expected offset {next})",
                    m.bytes, m.offset
                )));
            }
            next += m.bytes;
            mappings.push(m);
        }
        Ok(SharedRange {
            pid: pid as i32,
            mappings,
        })
    }
}

/// Shares `[addr, addr + bytes)` of `device`'s memory with other processes: the start of the
/// whole mappings under it and the [`SharedRange`] to send (`Note [Sharing mapped memory]`).
/// `Ok(None)` when the range is not memory mapped by berth's allocator on `device` (memory from
/// `cuMemAlloc`, which `cudaIpcGetMemHandle` shares, or a device whose allocator was not
/// built).
///
/// # Errors
/// [`CudaError::Ipc`] when the driver created the handles unexportable or refuses to export
/// one; [`CudaError::Driver`] for another driver failure.
pub fn share(
    device: usize,
    addr: u64,
    bytes: usize,
) -> Result<Option<(u64, SharedRange)>, CudaError> {
    let Some(backend) = crate::memory::existing_backend(device) else {
        return Ok(None);
    };
    let Some(exported) = backend.export_covering(addr, bytes)? else {
        return Ok(None);
    };
    let base = exported[0].addr;
    let mappings = exported
        .iter()
        .map(|e| SharedMapping {
            offset: e.addr - base,
            bytes: e.bytes as u64,
            fd: e.fd,
        })
        .collect();
    Ok(Some((
        base,
        SharedRange {
            pid: std::process::id() as i32,
            mappings,
        },
    )))
}

/// Memory of another process mapped into this one by [`open`]; unmapped, released and its
/// addresses freed on drop.
#[derive(Debug)]
pub struct OpenedRange {
    device: usize,
    base: u64,
    bytes: usize,
    /// The imported handles, by offset, each mapped whole.
    handles: Vec<(u64, u64, usize)>,
}

impl OpenedRange {
    /// The device address of the range's first byte in this process.
    pub fn ptr(&self) -> u64 {
        self.base
    }

    /// The range's length in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for OpenedRange {
    fn drop(&mut self) {
        // SAFETY: every handle was mapped whole at its offset by `open`, nothing of this
        // process uses the range once its owner drops it, and each is unmapped and released
        // once, here; the reservation is freed after all its mappings are gone.
        unsafe {
            for &(off, h, bytes) in &self.handles {
                let _ = ffi::mem_unmap(self.device, self.base + off, bytes);
                let _ = ffi::mem_release(self.device, h);
            }
            let _ = ffi::address_free(self.device, self.base, self.bytes);
        }
    }
}

/// Maps a range another process shared with [`share`] on `device` of this process, readable
/// and writable (`Note [Sharing mapped memory]`, 3).
///
/// # Errors
/// [`CudaError::Ipc`] when the sender's descriptors cannot be taken (it exited, or the kernel
/// forbids it) or imported; [`CudaError::Driver`] / [`CudaError::OutOfMemory`] when reserving
/// or mapping fails. Nothing stays mapped or reserved on an error.
pub fn open(device: usize, range: &SharedRange) -> Result<OpenedRange, CudaError> {
    let total = usize::try_from(range.bytes()).map_err(|_| CudaError::InvalidArgument {
        op: "open shared memory",
        what: format!(
            "{} bytes do not fit this machine's address space",
            range.bytes()
        ),
    })?;
    let base = ffi::address_reserve(device, total)?;
    let mut opened = OpenedRange {
        device,
        base,
        bytes: total,
        handles: Vec::with_capacity(range.mappings.len()),
    };
    // From here on `opened`'s drop undoes whatever was done, on every error path.
    for m in &range.mappings {
        let fd = ffi::os::fd_of_process(range.pid, m.fd).map_err(|e| CudaError::Ipc {
            reason: format!(
                "cannot take descriptor {} of process {} ({e}): {}",
                m.fd,
                range.pid,
                why_no_fd(&e)
            ),
        })?;
        let h = {
            use std::os::fd::AsRawFd;
            ffi::mem_import_fd(device, fd.as_raw_fd())?
        };
        let bytes = m.bytes as usize;
        // SAFETY: `base + offset .. + bytes` lies in the reservation made above and is not
        // mapped yet (the mappings are adjacent and each is mapped once); `h` is a live handle
        // of `bytes` bytes.
        if let Err(e) = unsafe { ffi::mem_map(device, base + m.offset, bytes, h) } {
            // SAFETY: `h` is mapped nowhere and released once, here.
            let _ = unsafe { ffi::mem_release(device, h) };
            return Err(e);
        }
        opened.handles.push((m.offset, h, bytes));
    }
    ffi::mem_set_access(device, base, total)?;
    Ok(opened)
}

/// What a user does about a descriptor that could not be taken from the sender.
fn why_no_fd(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(3) => "the sending process has exited; keep it alive until the receiver has opened the memory",
        Some(1) => "the kernel's ptrace rules forbid it (run both processes as the same user; with Yama, /proc/sys/kernel/yama/ptrace_scope must be 0 unless the sender is the receiver's child), or use the 'pytorch' policy, whose memory is shared without descriptors",
        Some(9) => "the sender no longer shares this memory (it was unmapped there)",
        Some(38) => "this kernel has no pidfd_getfd (Linux 5.6 or newer is needed), or use the 'pytorch' policy, whose memory is shared without descriptors",
        _ => "use the 'pytorch' policy, whose memory is shared without descriptors",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range() -> SharedRange {
        SharedRange {
            pid: 4242,
            mappings: vec![
                SharedMapping {
                    offset: 0,
                    bytes: 2 << 20,
                    fd: 7,
                },
                SharedMapping {
                    offset: 2 << 20,
                    bytes: 32 << 20,
                    fd: 9,
                },
            ],
        }
    }

    #[test]
    fn a_range_reads_back_from_its_bytes() {
        let r = range();
        let b = r.to_bytes();
        assert_eq!(b.len(), 12 + 2 * 20);
        assert_eq!(&b[..12], &[1, 0, 0, 0, 0x92, 0x10, 0, 0, 2, 0, 0, 0]);
        assert_eq!(SharedRange::from_bytes(&b).unwrap(), r);
        assert_eq!(r.bytes(), 34 << 20);
    }

    #[test]
    fn bad_handles_are_refused_saying_why() {
        let msg = |b: &[u8]| SharedRange::from_bytes(b).unwrap_err().to_string();
        assert_eq!(
            msg(&[1, 0, 0]),
            "open shared memory: invalid argument: the handle has 3 bytes, fewer than its 12-byte header"
        );
        let mut b = range().to_bytes();
        b[0] = 2;
        assert_eq!(
            msg(&b),
            "open shared memory: invalid argument: the handle is of format 2; this berth reads format 1 (send and receive with the same berth)"
        );
        let b = range().to_bytes();
        assert_eq!(
            msg(&b[..b.len() - 1]),
            "open shared memory: invalid argument: the handle has 51 bytes for 2 mappings; it needs at least one mapping and 52 bytes"
        );
        let mut gap = range();
        gap.mappings[1].offset += 4096;
        assert_eq!(
            msg(&gap.to_bytes()),
            format!(
                "open shared memory: invalid argument: mapping 1 is {} bytes at offset {}; mappings must be non-empty and adjacent from offset 0 (expected offset {})",
                32 << 20,
                (2 << 20) + 4096,
                2 << 20
            )
        );
        let none = SharedRange {
            pid: 1,
            mappings: vec![],
        };
        assert!(msg(&none.to_bytes()).contains("it needs at least one mapping"));
    }

    #[test]
    fn every_refused_descriptor_says_what_to_do() {
        for code in [1, 3, 9, 38, 22] {
            let why = why_no_fd(&std::io::Error::from_raw_os_error(code));
            assert!(why.len() > 40, "{code}: {why}");
        }
        assert!(why_no_fd(&std::io::Error::from_raw_os_error(1)).contains("ptrace_scope"));
    }
}
