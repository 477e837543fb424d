// berth's full PyTorch CUDA allocator: a C++ `CUDAAllocator` whose every method forwards to
// berth's policies through the C functions of `berth_torch._native` (allocator_abi.rs and
// abi.rs in the crate). Built by `berth_torch` at first use against the installed PyTorch with
// torch.utils.cpp_extension (cached), and installed with PyTorch's own
// `changeCurrentAllocator`, the route PyTorch's backends take
// (https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.h).
//
// Note [The full allocator]
// PyTorch's `CUDAPluggableAllocator` forwards alloc and free and a few hooks; every other
// method of the allocator interface throws "does not yet support", so `torch.cuda.memory_stats`,
// `_snapshot`, `MemPool` and `torch.compile(mode="reduce-overhead")` break under it. This class
// derives from it (its bookkeeping of pointer -> size, device and stream, its DataPtr and
// raw_alloc paths stay PyTorch's) and answers the rest from berth:
// - statistics, snapshots and history from berth's allocator of each device, in PyTorch's
//   structures, so PyTorch's Python functions and memory_viz work unchanged;
// - private pools (CUDA graphs, MemPool) through berth's pools; a policy without them raises
//   with berth's reason; a MemPool with an allocator of its own takes its segments from that
//   allocator (Note [Pools with their own allocator] in berth-alloc);
// - during a CUDA graph capture, berth's calls run in relaxed capture mode (new segments are
//   legal) and berth records or queries no event (`Note [Private pools]` in berth-alloc);
// - out-of-memory as `c10::OutOfMemoryError` (Python: `torch.OutOfMemoryError`), after the
//   attached out-of-memory observers ran, as PyTorch's own allocator does;
// - CUDA IPC: memory from cuMemAlloc (policy "pytorch") in PyTorch's own handle format, so a
//   process with PyTorch's allocator can open what berth shares and the reverse; memory mapped
//   through virtual memory ("expandable", "paged") in berth's format (one file descriptor per
//   mapping), which a receiving process with berth's allocator installed opens.
// The C functions are found with dlsym in the already loaded `_native` library (its path is
// passed by Python), so this file links only against PyTorch.

#include <torch/extension.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::Stat;
using MempoolId = c10::cuda::MempoolId_t;

// ---- the C functions of berth_torch._native ----------------------------------------------

struct SnapshotSegment {
  int32_t device;
  uint64_t address, total_size, requested_size, allocated_size, active_size, stream;
  bool is_large, is_expandable;
  uint64_t pool_id0, pool_id1;
  size_t blocks;
};
struct SnapshotBlock {
  uint64_t address, size, requested_size;
  bool allocated, active;
};
struct SnapshotTrace {
  const char* action;
  int32_t device;
  uint64_t addr, size, stream;
  int64_t time_us;
};
struct SnapshotVisitor {
  void* ctx;
  void (*segment)(void*, const SnapshotSegment*);
  void (*block)(void*, const SnapshotBlock*);
  void (*trace)(void*, const SnapshotTrace*);
};

struct Abi {
  void* (*try_alloc)(size_t, int, void*);
  void (*free)(void*, size_t, int, void*);
  void (*record_stream)(void*, void*);
  void (*reset)();
  void (*set_memory_fraction)(double, int);
  size_t (*last_error)(char*, size_t);
  int (*last_error_is_oom)();
  size_t (*take_deferred_error)(char*, size_t);
  int (*visit_stats)(int, void (*)(void*, const char*, int64_t), void*);
  int (*reset_peak_stats)(int);
  int (*reset_accumulated_stats)(int);
  int (*visit_snapshot)(const SnapshotVisitor*);
  int (*record_history)(int, int64_t);
  int64_t (*largest_cached_block)(int);
  uint64_t (*base_allocation)(void*, uint64_t*);
  int (*create_or_incref_pool)(int, uint64_t, uint64_t);
  int (*create_pool_with_allocator)(int, uint64_t, uint64_t, uint64_t (*)(void*, uint64_t),
                                    void (*)(void*, uint64_t), void*, void (*)(void*));
  int (*begin_allocate_to_pool)(int, uint64_t, uint64_t, bool (*)(void*, uint64_t), void*,
                                void (*)(void*));
  int (*end_allocate_to_pool)(int, uint64_t, uint64_t);
  int (*release_pool)(int, uint64_t, uint64_t);
  int (*pool_use_count)(int, uint64_t, uint64_t);
  int (*check_pool_live_allocations)(int, uint64_t, uint64_t, const uint64_t*, size_t);
  int (*empty_pool_cache)(int, uint64_t, uint64_t);
  int (*restore_pool)(int, uint64_t, uint64_t, const uint64_t*, size_t);
  int (*set_use_on_oom)(int, uint64_t, uint64_t, int);
  int (*set_no_split)(int, uint64_t, uint64_t);
  int64_t (*ipc_share)(void*, uint8_t*, size_t, uint64_t*);
  void* (*ipc_open)(const uint8_t*, size_t, int, uint64_t*);
  void (*ipc_close)(void*);
};
Abi abi;

template <typename F>
void bind(void* lib, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  TORCH_CHECK(f != nullptr, "berth: ", name, " is missing from berth_torch._native (",
              dlerror(), "); reinstall berth_torch so the Python and native parts match");
}

void load_abi(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen(path.c_str(), RTLD_NOW);
  TORCH_CHECK(lib != nullptr, "berth: cannot open ", path, ": ", dlerror());
  bind(lib, abi.try_alloc, "berth_torch_try_alloc");
  bind(lib, abi.free, "berth_torch_free");
  bind(lib, abi.record_stream, "berth_torch_record_stream");
  bind(lib, abi.reset, "berth_torch_reset");
  bind(lib, abi.set_memory_fraction, "berth_torch_set_memory_fraction");
  bind(lib, abi.last_error, "berth_torch_last_error");
  bind(lib, abi.last_error_is_oom, "berth_torch_last_error_is_oom");
  bind(lib, abi.take_deferred_error, "berth_torch_take_deferred_error");
  bind(lib, abi.visit_stats, "berth_torch_visit_stats");
  bind(lib, abi.reset_peak_stats, "berth_torch_reset_peak_stats");
  bind(lib, abi.reset_accumulated_stats, "berth_torch_reset_accumulated_stats");
  bind(lib, abi.visit_snapshot, "berth_torch_visit_snapshot");
  bind(lib, abi.record_history, "berth_torch_record_history");
  bind(lib, abi.largest_cached_block, "berth_torch_largest_cached_block");
  bind(lib, abi.base_allocation, "berth_torch_base_allocation");
  bind(lib, abi.create_or_incref_pool, "berth_torch_create_or_incref_pool");
  bind(lib, abi.create_pool_with_allocator, "berth_torch_create_pool_with_allocator");
  bind(lib, abi.begin_allocate_to_pool, "berth_torch_begin_allocate_to_pool");
  bind(lib, abi.end_allocate_to_pool, "berth_torch_end_allocate_to_pool");
  bind(lib, abi.release_pool, "berth_torch_release_pool");
  bind(lib, abi.pool_use_count, "berth_torch_pool_use_count");
  bind(lib, abi.check_pool_live_allocations, "berth_torch_check_pool_live_allocations");
  bind(lib, abi.empty_pool_cache, "berth_torch_empty_pool_cache");
  bind(lib, abi.restore_pool, "berth_torch_restore_pool");
  bind(lib, abi.set_use_on_oom, "berth_torch_set_use_on_oom");
  bind(lib, abi.set_no_split, "berth_torch_set_no_split");
  bind(lib, abi.ipc_share, "berth_torch_ipc_share");
  bind(lib, abi.ipc_open, "berth_torch_ipc_open");
  bind(lib, abi.ipc_close, "berth_torch_ipc_close");
}

std::string last_error() {
  char buf[2048];
  size_t n = abi.last_error(buf, sizeof buf);
  return n == 0 ? std::string("berth: unknown error") : std::string(buf);
}

// Raises the error of a berth call that returned -1.
void check(int rc) {
  TORCH_CHECK(rc >= 0, last_error());
}

// ---- statistics ------------------------------------------------------------------------------

void collect_stat(void* ctx, const char* key, int64_t value) {
  (*static_cast<std::unordered_map<std::string, int64_t>*>(ctx))[key] = value;
}

void fill_stat(const std::unordered_map<std::string, int64_t>& m, const std::string& name,
               Stat& s) {
  auto get = [&](const char* part) {
    auto it = m.find(name + "." + part);
    return it == m.end() ? int64_t{0} : it->second;
  };
  s.current = get("current");
  s.peak = get("peak");
  s.allocated = get("allocated");
  s.freed = get("freed");
}

DeviceStats device_stats(int device) {
  std::unordered_map<std::string, int64_t> m;
  check(abi.visit_stats(device, collect_stat, &m));
  DeviceStats s;
  const char* pools[] = {"all", "small_pool", "large_pool"};
  auto array = [&](const char* name, c10::CachingDeviceAllocator::StatArray& a) {
    for (size_t i = 0; i < 3; i++) fill_stat(m, std::string(name) + "." + pools[i], a[i]);
  };
  array("allocation", s.allocation);
  array("segment", s.segment);
  array("active", s.active);
  array("inactive_split", s.inactive_split);
  array("allocated_bytes", s.allocated_bytes);
  array("reserved_bytes", s.reserved_bytes);
  array("active_bytes", s.active_bytes);
  array("inactive_split_bytes", s.inactive_split_bytes);
  array("requested_bytes", s.requested_bytes);
  auto scalar = [&](const char* k) {
    auto it = m.find(k);
    return it == m.end() ? int64_t{0} : it->second;
  };
  s.num_alloc_retries = scalar("num_alloc_retries");
  s.num_ooms = scalar("num_ooms");
  s.num_sync_all_streams = scalar("num_sync_all_streams");
  s.num_device_alloc = scalar("num_device_alloc");
  s.num_device_free = scalar("num_device_free");
  s.max_split_size = scalar("max_split_size");
  fill_stat(m, "oversize_allocations", s.oversize_allocations);
  fill_stat(m, "oversize_segments", s.oversize_segments);
  return s;
}

// ---- snapshots -------------------------------------------------------------------------------

struct SnapshotBuilder {
  cca::SnapshotInfo info;
  MempoolId only;  // {0, 0}: every pool
  bool keep_segment = false;
};

void on_segment(void* ctx, const SnapshotSegment* s) {
  auto* b = static_cast<SnapshotBuilder*>(ctx);
  MempoolId pool{s->pool_id0, s->pool_id1};
  b->keep_segment = (b->only == MempoolId{0, 0}) || b->only == pool;
  if (!b->keep_segment) return;
  c10::CachingDeviceAllocator::SegmentInfo seg;
  seg.device = static_cast<c10::DeviceIndex>(s->device);
  seg.address = s->address;
  seg.total_size = s->total_size;
  seg.requested_size = s->requested_size;
  seg.allocated_size = s->allocated_size;
  seg.active_size = s->active_size;
  seg.stream = reinterpret_cast<void*>(s->stream);
  seg.is_large = s->is_large;
  seg.is_expandable = s->is_expandable;
  seg.owner_private_pool_id = pool;
  b->info.segments.push_back(std::move(seg));
}

void on_block(void* ctx, const SnapshotBlock* blk) {
  auto* b = static_cast<SnapshotBuilder*>(ctx);
  if (!b->keep_segment) return;
  c10::CachingDeviceAllocator::BlockInfo info;
  info.size = blk->size;
  info.requested_size = blk->requested_size;
  info.allocated = blk->allocated;
  info.active = blk->active;
  b->info.segments.back().blocks.push_back(std::move(info));
}

cca::TraceEntry::Action action_of(const char* a) {
  static const std::map<std::string, cca::TraceEntry::Action> actions = {
      {"alloc", cca::TraceEntry::ALLOC},
      {"free_requested", cca::TraceEntry::FREE_REQUESTED},
      {"free_completed", cca::TraceEntry::FREE_COMPLETED},
      {"segment_alloc", cca::TraceEntry::SEGMENT_ALLOC},
      {"segment_free", cca::TraceEntry::SEGMENT_FREE},
      {"segment_map", cca::TraceEntry::SEGMENT_MAP},
      {"segment_unmap", cca::TraceEntry::SEGMENT_UNMAP},
      {"snapshot", cca::TraceEntry::SNAPSHOT},
      {"oom", cca::TraceEntry::OOM},
  };
  auto it = actions.find(a);
  return it == actions.end() ? cca::TraceEntry::SNAPSHOT : it->second;
}

void on_trace(void* ctx, const SnapshotTrace* t) {
  auto* b = static_cast<SnapshotBuilder*>(ctx);
  auto& traces = b->info.device_traces;
  if (t->device < 0) return;
  if (traces.size() <= static_cast<size_t>(t->device)) traces.resize(t->device + 1);
  cca::TraceEntry e(action_of(t->action), static_cast<c10::DeviceIndex>(t->device), t->addr,
                    t->size, reinterpret_cast<void*>(t->stream), MempoolId{0, 0}, 0);
  // The snapshot's Python conversion reads microseconds from `t_`.
  e.time_.t_ = t->time_us;
  traces[t->device].push_back(std::move(e));
}

// ---- private pools -------------------------------------------------------------------------

using StreamFilterFn = std::function<bool(cudaStream_t)>;

bool call_filter(void* ctx, uint64_t stream) {
  return (*static_cast<StreamFilterFn*>(ctx))(reinterpret_cast<cudaStream_t>(stream));
}

void drop_filter(void* ctx) {
  delete static_cast<StreamFilterFn*>(ctx);
}

// A MemPool's own allocator, held by berth for the pool's life: berth takes the pool's
// segments from raw_alloc and gives them back through raw_delete. An exception must not cross
// into berth: a failed allocation is no memory (berth's out-of-memory path follows), a failed
// free is said once. berth calls them without its own lock held (Note [Pools with their own
// allocator]), so an allocator that runs Python or frees tensors does not deadlock.
using PoolAllocator = std::shared_ptr<cca::CUDAAllocator>;

uint64_t pool_allocator_alloc(void* ctx, uint64_t bytes) {
  try {
    return reinterpret_cast<uint64_t>((*static_cast<PoolAllocator*>(ctx))->raw_alloc(bytes));
  } catch (const std::exception& e) {
    TORCH_WARN_ONCE("berth: a MemPool's own allocator failed to allocate ", bytes,
                    " bytes; taken as out of memory: ", e.what());
    return 0;
  } catch (...) {
    TORCH_WARN_ONCE("berth: a MemPool's own allocator failed to allocate ", bytes,
                    " bytes (a non-standard exception); taken as out of memory");
    return 0;
  }
}

void pool_allocator_free(void* ctx, uint64_t ptr) {
  try {
    (*static_cast<PoolAllocator*>(ctx))->raw_delete(reinterpret_cast<void*>(ptr));
  } catch (const std::exception& e) {
    TORCH_WARN_ONCE("berth: a MemPool's own allocator failed to free ", ptr, ": ", e.what());
  } catch (...) {
    TORCH_WARN_ONCE("berth: a MemPool's own allocator failed to free ", ptr,
                    " (a non-standard exception)");
  }
}

void pool_allocator_drop(void* ctx) {
  delete static_cast<PoolAllocator*>(ctx);
}

// What getCheckpointState hands CUDA-graph trees: the pool and its allocated blocks then
// (address, size in bytes, stream).
struct CheckpointBlock {
  uint64_t address, size;
  cudaStream_t stream;
};
struct BerthPoolState : cca::AllocatorState {
  MempoolId pool;
  std::vector<CheckpointBlock> live;
};

// A block a checkpoint restore allocated: freed through berth when its storage dies.
struct RestoredBlock {
  size_t size;
  c10::DeviceIndex device;
  cudaStream_t stream;
};

// ---- IPC -------------------------------------------------------------------------------------

// PyTorch's handle format: [version][type 'c'][cudaIpcMemHandle_t]; the version byte went from
// 2 to 3 in PyTorch 2.13 with the 'c' payload unchanged.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
constexpr char kHandleVersion = 3;
#else
constexpr char kHandleVersion = 2;
#endif
constexpr char kCudaMalloc = 'c';
// berth's own type: memory a policy mapped through CUDA virtual memory, shared as one POSIX
// file descriptor per mapping (`Note [Sharing mapped memory]` in berth-cuda's ipc.rs). Only a
// process with berth's allocator installed opens it.
constexpr char kBerthMapped = 'b';

// ---- the allocator ---------------------------------------------------------------------------

class BerthAllocator : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  explicit BerthAllocator(std::string policy)
      : CUDAPluggableAllocator(
            [this](size_t size, int device, cudaStream_t stream) {
              return this->alloc(size, device, stream);
            },
            [](void* ptr, size_t size, int device, cudaStream_t stream) {
              c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
              abi.free(ptr, size, device, stream);
            }),
        policy_(std::move(policy)) {}

  std::string name() override { return "berth:" + policy_; }

  double getMemoryFraction(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = fractions_.find(device);
    return it == fractions_.end() ? 1.0 : it->second;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction ", fraction,
                ": the memory fraction must be between 0 and 1");
    abi.set_memory_fraction(fraction, device);
    raise_deferred();
    std::lock_guard<std::mutex> g(mu_);
    fractions_[device] = fraction;
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return {};
  }

  void emptyCache(MempoolId pool = {0, 0}) override {
    if (pool == MempoolId{0, 0}) {
      abi.reset();
      raise_deferred();
    } else {
      // Every device that has the pool, as PyTorch's emptyCache(mempool_id).
      check(abi.empty_pool_cache(-1, pool.first, pool.second));
    }
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
    int64_t n = abi.largest_cached_block(device);
    *largest = n > 0 ? static_cast<size_t>(n) : 0;
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    uint64_t sz = 0;
    uint64_t base = abi.base_allocation(ptr, &sz);
    TORCH_CHECK(base != 0, "berth: ", ptr, " is not memory of berth's allocator");
    if (size) *size = sz;
    return reinterpret_cast<void*>(base);
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get()) return;
    abi.record_stream(ptr.get(), stream.stream());
    raise_deferred();
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override { return device_stats(device); }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check(abi.reset_accumulated_stats(device));
  }

  void resetPeakStats(c10::DeviceIndex device) override { check(abi.reset_peak_stats(device)); }

  cca::SnapshotInfo snapshot(MempoolId pool, bool include_traces = true) override {
    SnapshotBuilder b;
    b.only = pool;
    SnapshotVisitor v{&b, on_segment, on_block, include_traces ? on_trace : nullptr};
    check(abi.visit_snapshot(&v));
    size_t devices = static_cast<size_t>(c10::cuda::device_count());
    if (b.info.device_traces.size() < devices) b.info.device_traces.resize(devices);
    b.info.config_metadata.expandable_segments = policy_ != "pytorch";
    b.info.config_metadata.last_allocator_settings = "berth:" + policy_;
    return b.info;
  }

  void recordHistory(bool enabled, cca::CreateContextFn, size_t max_entries, cca::RecordContext,
                     bool, const std::vector<std::string>&) override {
    int64_t n = enabled ? static_cast<int64_t>(std::min<size_t>(max_entries, INT64_MAX)) : -1;
    check(abi.record_history(c10::cuda::current_device(), n));
    std::lock_guard<std::mutex> g(mu_);
    history_ = enabled;
  }

  bool isHistoryEnabled() override {
    std::lock_guard<std::mutex> g(mu_);
    return history_;
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(mu_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker) override {
    // berth's history is read through snapshot(); live trace callbacks are not delivered.
  }

  void beginAllocateToPool(c10::DeviceIndex device, MempoolId pool,
                           std::function<bool(cudaStream_t)> filter) override {
    auto* f = new StreamFilterFn(std::move(filter));
    check(abi.begin_allocate_to_pool(device, pool.first, pool.second, call_filter, f,
                                     drop_filter));
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId pool) override {
    check(abi.end_allocate_to_pool(device, pool.first, pool.second));
  }

  void releasePool(c10::DeviceIndex device, MempoolId pool) override {
    check(abi.release_pool(device, pool.first, pool.second));
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId pool) override {
    int n = abi.pool_use_count(device, pool.first, pool.second);
    check(n);
    return n;
  }

  void createOrIncrefPool(c10::DeviceIndex device, MempoolId pool,
                          std::shared_ptr<cca::CUDAAllocator> allocator = nullptr) override {
    if (allocator != nullptr && allocator.get() != this) {
      // berth_torch_create_pool_with_allocator drops the copy itself when it fails.
      check(abi.create_pool_with_allocator(device, pool.first, pool.second,
                                           pool_allocator_alloc, pool_allocator_free,
                                           new PoolAllocator(std::move(allocator)),
                                           pool_allocator_drop));
      return;
    }
    check(abi.create_or_incref_pool(device, pool.first, pool.second));
  }

  void setUseOnOOM(c10::DeviceIndex device, MempoolId pool, bool use_on_oom) override {
    check(abi.set_use_on_oom(device, pool.first, pool.second, use_on_oom ? 1 : 0));
  }

  void setNoSplit(c10::DeviceIndex device, MempoolId pool) override {
    check(abi.set_no_split(device, pool.first, pool.second));
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId pool,
                                const std::unordered_set<void*>& expected) override {
    std::vector<uint64_t> ptrs;
    ptrs.reserve(expected.size());
    for (void* p : expected) ptrs.push_back(reinterpret_cast<uint64_t>(p));
    int r = abi.check_pool_live_allocations(device, pool.first, pool.second, ptrs.data(),
                                            ptrs.size());
    check(r);
    return r == 1;
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          MempoolId pool) override {
    auto state = std::make_shared<BerthPoolState>();
    state->pool = pool;
    for (const auto& seg : snapshot(pool, false).segments) {
      if (seg.device != device) continue;
      uint64_t addr = seg.address;
      for (const auto& b : seg.blocks) {
        if (b.allocated) {
          state->live.push_back(CheckpointBlock{addr, static_cast<uint64_t>(b.size),
                                                reinterpret_cast<cudaStream_t>(seg.stream)});
        }
        addr += b.size;
      }
    }
    return state;
  }

  // Note [Restoring a pool checkpoint] (berth-alloc) says what berth does; here, PyTorch's
  // side: every block the pool held is reported freed (its bookkeeping dropped), every block
  // of the checkpoint comes back as a DataPtr with this allocator's deleter, which PyTorch
  // hands to the storages still alive. Those blocks are not in the pluggable base's
  // bookkeeping (its metadata type cannot be made outside libtorch), so raw_delete finds them
  // in restored_ first.
  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> as) override {
    auto state = std::dynamic_pointer_cast<BerthPoolState>(as);
    TORCH_CHECK(state, "berth: setCheckpointPoolState was given a checkpoint of another "
                "allocator; take it with getCheckpointState under berth's allocator");
    std::vector<void*> freed;
    for (const auto& seg : snapshot(state->pool, false).segments) {
      if (seg.device != device) continue;
      uint64_t addr = seg.address;
      for (const auto& b : seg.blocks) {
        if (b.allocated) freed.push_back(reinterpret_cast<void*>(addr));
        addr += b.size;
      }
    }
    std::vector<uint64_t> pairs;
    pairs.reserve(2 * state->live.size());
    for (const auto& b : state->live) {
      pairs.push_back(b.address);
      pairs.push_back(b.size);
    }
    check(abi.restore_pool(device, state->pool.first, state->pool.second, pairs.data(),
                           state->live.size()));
    {
      std::lock_guard<std::mutex> g(allocator_mutex_);
      for (void* p : freed) allocation_metadata_.erase(p);
    }
    cca::CheckpointDelta delta;
    {
      std::lock_guard<std::mutex> g(restored_mu_);
      for (void* p : freed) restored_.erase(p);
      for (const auto& b : state->live) {
        restored_[reinterpret_cast<void*>(b.address)] = {b.size, device, b.stream};
      }
      any_restored_.store(true, std::memory_order_release);
    }
    for (const auto& b : state->live) {
      void* p = reinterpret_cast<void*>(b.address);
      delta.dataptrs_allocd.emplace_back(p, p, raw_deleter(),
                                         c10::Device(c10::DeviceType::CUDA, device));
    }
    delta.ptrs_freed = std::move(freed);
    return delta;
  }

  void raw_delete(void* ptr) override {
    if (any_restored_.load(std::memory_order_acquire)) {
      RestoredBlock r{};
      bool found = false;
      {
        std::lock_guard<std::mutex> g(restored_mu_);
        auto it = restored_.find(ptr);
        if (it != restored_.end()) {
          r = it->second;
          restored_.erase(it);
          found = true;
        }
      }
      if (found) {
        c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
        abi.free(ptr, r.size, r.device, r.stream);
        return;
      }
    }
    CUDAPluggableAllocator::raw_delete(ptr);
  }

  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    // Mapped memory of "expandable" and "paged": berth's format.
    std::vector<uint8_t> buf(512);
    uint64_t mapped_base = 0;
    int64_t n = abi.ipc_share(ptr, buf.data(), buf.size(), &mapped_base);
    if (n < 0 && n != INT64_MIN) {
      buf.resize(static_cast<size_t>(-n));
      n = abi.ipc_share(ptr, buf.data(), buf.size(), &mapped_base);
    }
    TORCH_CHECK(n >= 0, "berth: cannot share this CUDA tensor with another process: ",
                last_error());
    if (n > 0) {
      std::string handle;
      handle.push_back(kHandleVersion);
      handle.push_back(kBerthMapped);
      handle.append(reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(n));
      return cca::ShareableHandle{
          static_cast<char*>(ptr) - reinterpret_cast<char*>(mapped_base), handle};
    }
    // Memory from cuMemAlloc: PyTorch's format.
    size_t size = 0;
    void* base = getBaseAllocation(ptr, &size);
    cudaIpcMemHandle_t h;
    C10_CUDA_CHECK(cudaIpcGetMemHandle(&h, base));
    std::string handle;
    handle.push_back(kHandleVersion);
    handle.push_back(kCudaMalloc);
    handle.append(reinterpret_cast<const char*>(&h), CUDA_IPC_HANDLE_SIZE);
    return cca::ShareableHandle{static_cast<char*>(ptr) - static_cast<char*>(base), handle};
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    if (handle.size() > 2 && handle[0] <= kHandleVersion && handle[1] == kBerthMapped) {
      return open_mapped(handle);
    }
    TORCH_CHECK(handle.size() == 2 + CUDA_IPC_HANDLE_SIZE && handle[0] <= kHandleVersion &&
                    handle[1] == kCudaMalloc,
                "berth: this CUDA IPC handle is not one berth can open (it opens cudaMalloc "
                "memory in PyTorch's format and memory berth's 'expandable' and 'paged' policies "
                "mapped; PyTorch's own expandable segments are not among them)");
    std::lock_guard<std::mutex> g(ipc_mu_);
    auto it = ipc_.find(handle);
    if (it != ipc_.end()) {
      if (auto p = it->second.lock()) return p;
    }
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data() + 2, CUDA_IPC_HANDLE_SIZE);
    void* dev = nullptr;
    C10_CUDA_CHECK(cudaIpcOpenMemHandle(&dev, h, cudaIpcMemLazyEnablePeerAccess));
    int device = c10::cuda::current_device();
    std::shared_ptr<void> p(dev, [this, handle, device](void* q) {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      C10_CUDA_CHECK_WARN(cudaIpcCloseMemHandle(q));
      std::lock_guard<std::mutex> g2(ipc_mu_);
      ipc_.erase(handle);
    });
    ipc_[handle] = p;
    return p;
  }

 private:
  // Maps memory another process shared in berth's format; cached by handle like cudaIpc
  // memory, unmapped when the last tensor on it goes.
  std::shared_ptr<void> open_mapped(const std::string& handle) {
    std::lock_guard<std::mutex> g(ipc_mu_);
    auto it = ipc_.find(handle);
    if (it != ipc_.end()) {
      if (auto p = it->second.lock()) return p;
    }
    int device = c10::cuda::current_device();
    uint64_t dev = 0;
    void* owner = abi.ipc_open(reinterpret_cast<const uint8_t*>(handle.data()) + 2,
                               handle.size() - 2, device, &dev);
    TORCH_CHECK(owner != nullptr, "berth: cannot open the CUDA tensor another process shared: ",
                last_error());
    std::shared_ptr<void> p(reinterpret_cast<void*>(dev), [this, handle, owner](void*) {
      abi.ipc_close(owner);
      std::lock_guard<std::mutex> g2(ipc_mu_);
      auto found = ipc_.find(handle);
      if (found != ipc_.end() && found->second.expired()) ipc_.erase(found);
    });
    ipc_[handle] = p;
    return p;
  }

  void* alloc(size_t size, int device, cudaStream_t stream) {
    void* p = nullptr;
    {
      // A new segment during a CUDA graph capture: the driver's allocation calls are legal
      // only in relaxed capture mode, as in PyTorch's own allocator.
      c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
      p = abi.try_alloc(size, device, stream);
    }
    if (p != nullptr || size == 0) return p;
    std::string msg = last_error();
    if (abi.last_error_is_oom()) {
      std::vector<cca::OutOfMemoryObserver> observers;
      {
        std::lock_guard<std::mutex> g(mu_);
        observers = oom_observers_;
      }
      if (!observers.empty()) {
        size_t free_b = 0, total_b = 0;
        {
          c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
          C10_CUDA_CHECK_WARN(cudaMemGetInfo(&free_b, &total_b));
        }
        auto allocated = device_stats(device).allocated_bytes[0].current;
        for (auto& o : observers) o(device, allocated, total_b, free_b);
      }
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    }
    TORCH_CHECK(false, msg);
  }

  void raise_deferred() {
    char buf[2048];
    size_t n = abi.take_deferred_error(buf, sizeof buf);
    TORCH_CHECK(n == 0, std::string(buf));
  }

  std::string policy_;
  std::mutex mu_;
  std::unordered_map<c10::DeviceIndex, double> fractions_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  bool history_ = false;
  std::mutex ipc_mu_;
  // Blocks allocated by checkpoint restores, by address (see setCheckpointPoolState).
  std::mutex restored_mu_;
  std::unordered_map<void*, RestoredBlock> restored_;
  std::atomic<bool> any_restored_{false};
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_;
};

std::shared_ptr<BerthAllocator> installed;

// Whether PyTorch would take another allocator now: its current one has not been initialised
// (changeCurrentAllocator refuses once it has, which torch.cuda.current_device(),
// get_device_capability(), pin_memory() and any CUDA tensor do, even while
// torch.cuda.is_initialized() is still false: pytorch/pytorch#140687).
bool can_install() {
  return installed != nullptr || !cca::allocator.load()->initialized();
}

// Makes berth's allocator PyTorch's CUDA allocator. `native_path` is berth_torch._native's file.
void install(const std::string& native_path, const std::string& policy) {
  if (installed) return;
  load_abi(native_path);
  auto a = std::make_shared<BerthAllocator>(policy);
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
  installed = a;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "berth's full PyTorch CUDA allocator (see berth_torch.use_allocator)";
  m.def("install", &install, "Makes berth's allocator PyTorch's CUDA allocator",
        pybind11::arg("native_path"), pybind11::arg("policy"));
  m.def("name", []() { return installed ? installed->name() : std::string(); });
  m.def("can_install", &can_install,
        "Whether PyTorch's current CUDA allocator is still uninitialised (a swap would work)");
}
