//! The CUDA C prelude every kernel module starts with: storage and compute types per dtype,
//! half/bfloat16 conversions done by hand (no `cuda_fp16.h`, so NVRTC needs no include path),
//! math overloads, the strided index structs and warp/block reductions.
//!
//! A module is compiled for one dtype: [`module_source`] puts `#define SUF f32` (etc.) in front
//! of the family's source, and the macros `S`, `C`, `A`, `LD`, `ST`, `KN(name)` name that dtype's
//! storage type, compute type, accumulator type, load, store and kernel name (`name_f32`).

use crate::DType;

/// Shared device code, prepended to every family's source.
pub(crate) const PRELUDE: &str = r#"
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define MAXD 8
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(unsigned short h) {
    float f; asm("{cvt.f32.f16 %0, %1;}" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h; asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float bf2f(unsigned short b) {
    return __int_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

/* storage type s_*, compute type c_*, accumulator a_*, sum-output storage so_* */
typedef float s_f32; typedef float c_f32; typedef float a_f32; typedef float so_f32;
__device__ __forceinline__ float ld_f32(float v) { return v; }
__device__ __forceinline__ float st_f32(float v) { return v; }
__device__ __forceinline__ float sto_f32(float v) { return v; }

typedef double s_f64; typedef double c_f64; typedef double a_f64; typedef double so_f64;
__device__ __forceinline__ double ld_f64(double v) { return v; }
__device__ __forceinline__ double st_f64(double v) { return v; }
__device__ __forceinline__ double sto_f64(double v) { return v; }

typedef unsigned short s_f16; typedef float c_f16; typedef float a_f16; typedef unsigned short so_f16;
__device__ __forceinline__ float ld_f16(unsigned short v) { return h2f(v); }
__device__ __forceinline__ unsigned short st_f16(float v) { return f2h(v); }
__device__ __forceinline__ unsigned short sto_f16(float v) { return f2h(v); }

typedef unsigned short s_bf16; typedef float c_bf16; typedef float a_bf16; typedef unsigned short so_bf16;
__device__ __forceinline__ float ld_bf16(unsigned short v) { return bf2f(v); }
__device__ __forceinline__ unsigned short st_bf16(float v) { return f2bf(v); }
__device__ __forceinline__ unsigned short sto_bf16(float v) { return f2bf(v); }

typedef i64 s_i64; typedef i64 c_i64; typedef i64 a_i64; typedef i64 so_i64;
__device__ __forceinline__ i64 ld_i64(i64 v) { return v; }
__device__ __forceinline__ i64 st_i64(i64 v) { return v; }
__device__ __forceinline__ i64 sto_i64(i64 v) { return v; }

typedef int s_i32; typedef int c_i32; typedef i64 a_i32; typedef i64 so_i32;
__device__ __forceinline__ int ld_i32(int v) { return v; }
__device__ __forceinline__ int st_i32(int v) { return v; }
__device__ __forceinline__ i64 sto_i32(i64 v) { return v; }

typedef unsigned char s_u8; typedef int c_u8; typedef i64 a_u8; typedef i64 so_u8;
__device__ __forceinline__ int ld_u8(unsigned char v) { return (int)v; }
__device__ __forceinline__ unsigned char st_u8(int v) { return (unsigned char)v; }
__device__ __forceinline__ i64 sto_u8(i64 v) { return v; }

typedef unsigned char s_bool; typedef int c_bool; typedef i64 a_bool; typedef i64 so_bool;
__device__ __forceinline__ int ld_bool(unsigned char v) { return v != 0; }
__device__ __forceinline__ unsigned char st_bool(int v) { return v != 0; }
__device__ __forceinline__ i64 sto_bool(i64 v) { return v; }

/* conversions into each dtype's compute type: cv_<dst>(value of any compute type);
   bool is "non-zero" (PyTorch), the others are C casts (truncation toward zero) */
template <class T> __device__ __forceinline__ float cv_f32(T v) { return (float)v; }
template <class T> __device__ __forceinline__ double cv_f64(T v) { return (double)v; }
template <class T> __device__ __forceinline__ float cv_f16(T v) { return (float)v; }
template <class T> __device__ __forceinline__ float cv_bf16(T v) { return (float)v; }
template <class T> __device__ __forceinline__ i64 cv_i64(T v) { return (i64)v; }
template <class T> __device__ __forceinline__ int cv_i32(T v) { return (int)v; }
template <class T> __device__ __forceinline__ int cv_u8(T v) { return (int)(unsigned char)(int)v; }
template <class T> __device__ __forceinline__ int cv_bool(T v) { return v != (T)0; }

/* math: float and double use the libdevice functions; integers go through double */
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
template <class T> __device__ __forceinline__ T m_exp(T x) { return (T)exp((double)x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
template <class T> __device__ __forceinline__ T m_log(T x) { return (T)log((double)x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
template <class T> __device__ __forceinline__ T m_sqrt(T x) { return (T)sqrt((double)x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
template <class T> __device__ __forceinline__ T m_tanh(T x) { return (T)tanh((double)x); }
__device__ __forceinline__ float m_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double m_pow(double x, double y) { return pow(x, y); }
template <class T> __device__ __forceinline__ T m_pow(T x, T y) { return (T)pow((double)x, (double)y); }
template <class T> __device__ __forceinline__ bool m_isnan(T x) { return x != x; }
/* a * b and a + b each rounded on its own: NVRTC contracts `a * b + c` into one FMA by
   default (one rounding), which would differ in the last bit from two separate kernels.
   Note [Fused updates are exact] in `optim.rs`. Integers need no care. */
__device__ __forceinline__ float m_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double m_mul_rn(double a, double b) { return __dmul_rn(a, b); }
template <class T> __device__ __forceinline__ T m_mul_rn(T a, T b) { return a * b; }
__device__ __forceinline__ float m_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double m_add_rn(double a, double b) { return __dadd_rn(a, b); }
template <class T> __device__ __forceinline__ T m_add_rn(T a, T b) { return a + b; }

/* index structs, passed by value; shapes and strides in elements */
struct Idx1 { i64 ndim; i64 shape[MAXD]; i64 st0[MAXD]; };
struct Idx2 { i64 ndim; i64 shape[MAXD]; i64 st0[MAXD]; i64 st1[MAXD]; };
struct Idx3 { i64 ndim; i64 shape[MAXD]; i64 st0[MAXD]; i64 st1[MAXD]; i64 st2[MAXD]; };

__device__ __forceinline__ void off1(const Idx1& x, i64 i, i64& o0) {
    o0 = 0;
    for (int d = (int)x.ndim - 1; d >= 0; --d) { i64 c = i % x.shape[d]; i /= x.shape[d]; o0 += c * x.st0[d]; }
}
__device__ __forceinline__ void off2(const Idx2& x, i64 i, i64& o0, i64& o1) {
    o0 = 0; o1 = 0;
    for (int d = (int)x.ndim - 1; d >= 0; --d) {
        i64 c = i % x.shape[d]; i /= x.shape[d]; o0 += c * x.st0[d]; o1 += c * x.st1[d];
    }
}
__device__ __forceinline__ void off3(const Idx3& x, i64 i, i64& o0, i64& o1, i64& o2) {
    o0 = 0; o1 = 0; o2 = 0;
    for (int d = (int)x.ndim - 1; d >= 0; --d) {
        i64 c = i % x.shape[d]; i /= x.shape[d];
        o0 += c * x.st0[d]; o1 += c * x.st1[d]; o2 += c * x.st2[d];
    }
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

/* block-wide sum; every thread gets the result; `sh` holds at least 32 values */
template <class T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
template <class T> __device__ T block_sum(T v, T* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T r = (threadIdx.x < nw) ? sh[threadIdx.x] : (T)0;
    if (w == 0) r = warp_sum(r);
    if (threadIdx.x == 0) sh[0] = r;
    __syncthreads();
    r = sh[0];
    __syncthreads();
    return r;
}
/* block-wide max (NaN wins) */
template <class T> __device__ __forceinline__ T nan_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <class T> __device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
template <class T> __device__ T block_max(T v, T* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T r = (threadIdx.x < nw) ? sh[threadIdx.x] : sh[0];
    if (w == 0) r = warp_max(r);
    if (threadIdx.x == 0) sh[0] = r;
    __syncthreads();
    r = sh[0];
    __syncthreads();
    return r;
}
"#;

/// The full source of one module: prelude, the dtype macros for `dtype`, then `family`.
pub(crate) fn module_source(family: &str, dtype: DType) -> String {
    let suf = dtype.as_str();
    format!(
        "{PRELUDE}\n#define SUF {suf}\n#define S CAT(s_, SUF)\n#define C CAT(c_, SUF)\n\
         #define A CAT(a_, SUF)\n#define SO CAT(so_, SUF)\n#define LD CAT(ld_, SUF)\n\
         #define ST CAT(st_, SUF)\n#define FD CAT(cv_, SUF)\n#define STO CAT(sto_, SUF)\n#define KN(name) CAT(name, CAT(_, SUF))\n\
         #define IS_FLOAT {is_float}\n{family}\n",
        is_float = i32::from(dtype.is_float()),
    )
}
