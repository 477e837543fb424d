//! Storage: aliasing, pending device work before host access, external (pinned-style)
//! buffers, host byte accounting.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use berth::storage::{self, ExternalHostMemory, PendingWork};
use berth::{DType, Device, Storage, Tensor};

#[derive(Debug, Default)]
struct Flag {
    done: AtomicBool,
    waits: AtomicUsize,
}

impl PendingWork for Flag {
    fn wait(&self) -> berth::Result<()> {
        self.waits.fetch_add(1, Ordering::SeqCst);
        self.done.store(true, Ordering::SeqCst);
        Ok(())
    }
    fn is_complete(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }
}

#[test]
fn host_reads_and_writes_wait_for_pending_device_work_first() {
    let x = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    let w = Arc::new(Flag::default());
    x.storage().add_pending_work(w.clone());
    assert!(!x.storage().pending_work_complete());
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    assert_eq!(w.waits.load(Ordering::SeqCst), 1);
    // Waited once, then forgotten.
    x.sum().unwrap();
    assert_eq!(w.waits.load(Ordering::SeqCst), 1);
    let w2 = Arc::new(Flag::default());
    x.storage().add_pending_work(w2.clone());
    x.fill_(2.0).unwrap(); // a write waits too
    assert_eq!(w2.waits.load(Ordering::SeqCst), 1);
}

#[derive(Debug)]
struct Block(Vec<u64>);

// SAFETY: the test block owns a live, aligned buffer of its length until drop.
unsafe impl ExternalHostMemory for Block {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr() as *mut u8
    }
    fn len(&self) -> usize {
        self.0.len() * 8
    }
    fn is_pinned(&self) -> bool {
        true
    }
}

#[test]
fn external_host_memory_backs_a_tensor_and_reports_pinned() {
    let s = Storage::host_external(Box::new(Block(vec![0; 4])));
    assert_eq!(
        (s.nbytes(), s.device_of(), s.is_pinned()),
        (32, Device::Cpu, true)
    );
    assert!(!Tensor::ones(&[1], DType::F32, Device::Cpu)
        .unwrap()
        .is_pinned());
}

/// A pinned allocator's block is held as the allocator returned it: the storage says it is
/// pinned and hands the block back (for `record_stream`), with no lookup by address.
#[test]
fn a_pinned_block_is_held_as_is_and_reports_pinned() {
    use berth::alloc::host::{HostAllocation, HostCachingAllocator, SimHostBackend};
    let alloc = HostCachingAllocator::new(SimHostBackend::new(1 << 20));
    let block = alloc.allocate(40).unwrap();
    let ptr = block.as_ptr();
    let s = Storage::host_pinned(block);
    assert_eq!(
        (s.nbytes(), s.device_of(), s.is_pinned(), s.data_ptr()),
        (40, Device::Cpu, true, ptr as u64)
    );
    assert_eq!(s.pinned_block().map(HostAllocation::as_ptr), Some(ptr));
    assert!(s.external_host_memory().is_none());
    s.write_host("test").unwrap().bytes_mut().fill(7);
    assert_eq!(s.read_host("test").unwrap().bytes(), &[7; 40]);
    // An empty block is no pinned memory (PyTorch's `is_pinned()` on a null pointer).
    let empty = Storage::host_pinned(HostAllocation::empty());
    assert!(!empty.is_pinned() && empty.pinned_block().is_some());
    assert_eq!(empty.read_host("test").unwrap().bytes(), &[] as &[u8]);
    // Ordinary host storage holds no block.
    assert!(Storage::host_zeroed(8).pinned_block().is_none());
}

/// `Tensor::empty_pinned` without CUDA is a typed error, not a panic.
#[test]
fn empty_pinned_without_cuda_is_a_typed_error() {
    if berth::cuda::is_available() {
        return;
    }
    let err = Tensor::empty_pinned(&[2, 3], DType::F32).unwrap_err();
    assert!(
        matches!(
            err,
            berth::Error::Cuda(berth::cuda::CudaError::Unavailable { .. })
        ),
        "{err:?}"
    );
}

#[test]
fn host_bytes_are_counted_while_tensors_live() {
    // Other tests run in parallel: assert on a large allocation's effect on the peak.
    let big = 64 << 20;
    let x = Tensor::zeros(&[big / 4], DType::F32, Device::Cpu).unwrap();
    assert!(storage::host_memory_allocated() >= big);
    assert!(storage::max_host_memory_allocated() >= big);
    let during = storage::host_memory_allocated();
    drop(x);
    assert!(storage::host_memory_allocated() < during);
}

#[test]
fn in_place_writes_are_visible_through_every_alias_and_thread() {
    let x = Tensor::zeros(&[1000], DType::I64, Device::Cpu).unwrap();
    let views: Vec<Tensor> = (0..4).map(|_| x.alias()).collect();
    std::thread::scope(|s| {
        for v in &views {
            s.spawn(move || {
                for _ in 0..50 {
                    v.add_scalar_(1.0).unwrap();
                }
            });
        }
    });
    // Writes are serialised by the storage lock: no lost update.
    assert_eq!(x.to_vec::<i64>().unwrap(), vec![200; 1000]);
}

/// A layout whose strides do not have one entry per dimension is refused, typed: it passed in
/// release builds (the length check was a debug assertion) and panicked later in `to_vec`.
#[test]
fn from_parts_refuses_strides_of_another_rank() {
    let st = Arc::new(Storage::host_zeroed(16));
    for (shape, strides) in [(vec![2, 2], vec![1]), (vec![4], vec![1, 1])] {
        let e = Tensor::from_parts(
            Arc::clone(&st),
            berth::Layout::from_parts(shape.clone(), strides.clone(), 0),
            DType::F32,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "from_parts: shape {shape:?} has {} dimensions but strides {strides:?} has {}; give one stride per dimension",
                shape.len(),
                strides.len()
            )
        );
    }
    let ok = Tensor::from_parts(
        st,
        berth::Layout::from_parts(vec![2, 2], vec![2, 1], 0),
        DType::F32,
    )
    .unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap(), [0.0; 4]);
}
