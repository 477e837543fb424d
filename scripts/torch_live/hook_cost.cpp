// Per-call cost of PyTorch's CUDA allocator path, whatever allocator is installed: the same loop
// of raw_delete + raw_alloc_with_stream calls through c10's allocator object, as PyTorch's own
// code calls it. Under PyTorch's default this is its native caching allocator; under a
// CUDAPluggableAllocator it is PyTorch's wrapper (a lock and a hash-map insert or erase per call,
// https://github.com/pytorch/pytorch/blob/main/torch/csrc/cuda/CUDAPluggableAllocator.cpp) plus
// the library's hooks (berth_torch, or trivial_alloc.c). Called through ctypes by hook_cost.py.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <chrono>
#include <cstdint>
#include <vector>

extern "C" double berth_hook_cost_ns(int64_t iters, int64_t live, uint64_t seed) {
  auto *a = c10::cuda::CUDACachingAllocator::get();
  auto stream = c10::cuda::getCurrentCUDAStream();
  std::vector<void *> ring(static_cast<size_t>(live), nullptr);
  uint64_t s = seed;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    // 512 B .. 8 MiB, log-uniform, not multiples of each other: the shape of a training step's
    // activations and gradients.
    size_t size = (size_t{512} << ((s >> 33) % 15)) + ((s >> 17) % 4096) * 4;
    void *&slot = ring[static_cast<size_t>(i % live)];
    if (slot) a->raw_delete(slot);
    slot = a->raw_alloc_with_stream(size, stream);
  }
  auto t1 = std::chrono::steady_clock::now();
  for (void *p : ring)
    if (p) a->raw_delete(p);
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iters);
}
