/* A trivial caching CUDA allocator behind the same C ABI as berth_torch (PyTorch's
 * CUDAPluggableAllocator hooks), to measure what PyTorch's wrapper around a pluggable allocator
 * costs by itself (a lock and a hash-map insert per call, on PyTorch's side): the time of a
 * workload under this allocator minus its time under PyTorch's default is that wrapper's cost
 * plus this file's (one uncontended mutex and an O(1) hash lookup per call).
 *
 * Policy: requests rounded up to 512 bytes; a freed block is cached on (rounded size, stream)
 * and handed out again only for the same rounded size on the same stream; nothing is ever
 * returned to the driver except by empty_cache. A block recorded on another stream
 * (record_stream) is cached only after an event recorded on that stream at free time completed.
 * Build: gcc -O2 -shared -fPIC trivial_alloc.c -o trivial_alloc.so -I$CUDA/include
 *        -L$CUDA/lib64 -lcudart -lpthread */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define NB 65536 /* hash buckets (power of two) */

typedef struct Block {
  void *ptr;
  size_t size;       /* rounded */
  cudaStream_t stream, other; /* allocation stream; record_stream's stream (one kept) */
  cudaEvent_t ev;    /* pending: event on `other` recorded at free */
  struct Block *next; /* bucket chain (live map or free cache) or pending list */
} Block;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static Block *live[NB], *cache[NB], *pending;
static long long reserved, peak_reserved, allocated, peak_allocated, n_device_alloc;

static size_t hptr(void *p) { return ((uintptr_t)p >> 9) & (NB - 1); }
static size_t hkey(size_t s, cudaStream_t st) {
  return ((s >> 9) * 0x9E3779B97F4A7C15ull ^ (uintptr_t)st) & (NB - 1);
}

static void collect_pending(void) {
  Block **pp = &pending;
  while (*pp) {
    Block *b = *pp;
    if (cudaEventQuery(b->ev) == cudaSuccess) {
      *pp = b->next;
      cudaEventDestroy(b->ev);
      b->other = 0;
      size_t k = hkey(b->size, b->stream);
      b->next = cache[k]; cache[k] = b;
    } else {
      pp = &b->next;
    }
  }
}

void *trivial_alloc(size_t size, int device, cudaStream_t stream) {
  (void)device;
  if (size == 0) return 0;
  size_t s = (size + 511) & ~(size_t)511;
  pthread_mutex_lock(&mu);
  if (pending) collect_pending();
  size_t k = hkey(s, stream);
  Block **pp = &cache[k], *b = 0;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->size == s && (*pp)->stream == stream) { b = *pp; *pp = b->next; break; }
  if (!b) {
    void *p = 0;
    pthread_mutex_unlock(&mu);
    if (cudaMalloc(&p, s) != cudaSuccess) return 0;
    pthread_mutex_lock(&mu);
    b = calloc(1, sizeof *b);
    b->ptr = p; b->size = s; b->stream = stream;
    reserved += s; n_device_alloc++;
    if (reserved > peak_reserved) peak_reserved = reserved;
  }
  size_t h = hptr(b->ptr);
  b->next = live[h]; live[h] = b;
  allocated += s;
  if (allocated > peak_allocated) peak_allocated = allocated;
  pthread_mutex_unlock(&mu);
  return b->ptr;
}

static Block *take_live(void *ptr) {
  for (Block **pp = &live[hptr(ptr)]; *pp; pp = &(*pp)->next)
    if ((*pp)->ptr == ptr) { Block *b = *pp; *pp = b->next; return b; }
  return 0;
}

void trivial_free(void *ptr, size_t size, int device, cudaStream_t stream) {
  (void)size; (void)device; (void)stream;
  if (!ptr) return;
  pthread_mutex_lock(&mu);
  Block *b = take_live(ptr);
  if (b) {
    allocated -= b->size;
    if (b->other && b->other != b->stream &&
        cudaEventCreateWithFlags(&b->ev, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventRecord(b->ev, b->other) == cudaSuccess) {
      b->next = pending; pending = b;
    } else {
      size_t k = hkey(b->size, b->stream);
      b->next = cache[k]; cache[k] = b;
    }
  }
  pthread_mutex_unlock(&mu);
}

void trivial_record_stream(void *ptr, cudaStream_t stream) {
  pthread_mutex_lock(&mu);
  for (Block *b = live[hptr(ptr)]; b; b = b->next)
    if (b->ptr == ptr) { b->other = stream; break; }
  pthread_mutex_unlock(&mu);
}

void trivial_reset(void) {
  pthread_mutex_lock(&mu);
  cudaDeviceSynchronize();
  collect_pending();
  for (size_t k = 0; k < NB; k++)
    while (cache[k]) {
      Block *b = cache[k]; cache[k] = b->next;
      cudaFree(b->ptr); reserved -= b->size; free(b);
    }
  pthread_mutex_unlock(&mu);
}

/* 0 peak reserved, 1 peak allocated, 2 device allocations, 3 reserved, 4 allocated */
long long trivial_stat(int which) {
  long long v[5] = {peak_reserved, peak_allocated, n_device_alloc, reserved, allocated};
  return which >= 0 && which < 5 ? v[which] : -1;
}
