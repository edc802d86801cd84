// cslm_kernels.cc -- see cslm_kernels.h.
#include "cslm_kernels.h"

#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

// The hot loops (kernels below) are compiled three times, for AVX-512,
// AVX2+FMA and baseline x86-64 (or once elsewhere), with the 8-bit layers'
// product written for AMX, AVX-512 VNNI and AVX2, and the version the CPU
// supports is picked at load: a binary built for any x86-64 (as Moses is) uses
// the vector units the machine has.
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define CSLM_DISPATCH 1
#define CSLM_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define CSLM_AVX2 __attribute__((target("avx2,fma")))
#else
#define CSLM_DISPATCH 0
#endif
// AMX's tiles (Intel Xeon from Sapphire Rapids on) need a compiler that knows
// them (GCC 11, Clang 12) and Linux's permission for their state (5.16 on).
#if CSLM_DISPATCH && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define CSLM_AMX_DISPATCH 1
#define CSLM_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma")))
#else
#define CSLM_AMX_DISPATCH 0
#endif

namespace cslm {
namespace {

// The vectors the kernels compute with: as wide as the instruction set's
// registers (GCC/Clang vector extensions, so no intrinsics). A vector wider
// than the registers is not split into register-sized operations in a
// function compiled for a narrower target: it goes through memory element by
// element, some 50x slower, so each kernel is instantiated with its own width.
// The unaligned types are the same vectors at any float address (may alias).
typedef float Vec16 __attribute__((vector_size(64)));  // AVX-512: one zmm register
typedef float Vec16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef float Vec8 __attribute__((vector_size(32)));   // AVX2: one ymm register
typedef float Vec8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef float Vec4 __attribute__((vector_size(16)));   // baseline x86-64 (SSE2): one xmm register
typedef float Vec4u __attribute__((vector_size(16), aligned(4), may_alias));

// x . y, with 16 independent partial sums so that the compiler vectorises it
// without reassociating (no -ffast-math needed).
#define CSLM_DOT_BODY                                                     \
  float acc[16] = {0};                                                    \
  size_t i = 0;                                                           \
  for (; i + 16 <= n; i += 16)                                            \
    for (size_t l = 0; l < 16; ++l) acc[l] += x[i + l] * y[i + l];        \
  float s = 0;                                                            \
  for (; i < n; ++i) s += x[i] * y[i];                                    \
  for (size_t l = 0; l < 16; ++l) s += acc[l];                            \
  return s;

// y = bias + sum_i val[i] * wt[idx[i]]: a rectified layer's product with only
// its nonzero inputs (about half of them after a ReLU). The output is computed
// NB vectors (V, W floats each) at a time in registers, so that each weight
// row is read in one pass of NB*W contiguous floats per block and y is written
// once: with AVX-512's 32 registers a block of 16 covers a 256-unit layer
// whole, so each nonzero input's row streams through once. What is left of
// the output goes one vector, then one float, at a time. Every y[j] is summed
// in the same order (bias, then i = 0, 1, ...) whatever the block, so the
// result does not depend on NB or on the layer's width.
#define CSLM_GEMV_BODY(V, VU, W, NB)                                      \
  const size_t kBlock = (NB) * (W);                                       \
  size_t j = 0;                                                           \
  for (; j + kBlock <= out; j += kBlock) {                                \
    V acc[NB];                                                            \
    _Pragma("GCC unroll 16")                                              \
    for (size_t b = 0; b < (NB); ++b)                                     \
      acc[b] = *reinterpret_cast<const VU*>(bias + j + b * (W));          \
    for (size_t i = 0; i < nnz; ++i) {                                    \
      const float* w = wt + idx[i] * out + j;                             \
      const V a = V{} + val[i];                                           \
      _Pragma("GCC unroll 16")                                            \
      for (size_t b = 0; b < (NB); ++b)                                   \
        acc[b] += a * *reinterpret_cast<const VU*>(w + b * (W));          \
    }                                                                     \
    _Pragma("GCC unroll 16")                                              \
    for (size_t b = 0; b < (NB); ++b)                                     \
      *reinterpret_cast<VU*>(y + j + b * (W)) = acc[b];                   \
  }                                                                       \
  for (; j + (W) <= out; j += (W)) {                                      \
    V acc = *reinterpret_cast<const VU*>(bias + j);                       \
    for (size_t i = 0; i < nnz; ++i)                                      \
      acc += (V{} + val[i]) * *reinterpret_cast<const VU*>(wt + idx[i] * out + j); \
    *reinterpret_cast<VU*>(y + j) = acc;                                  \
  }                                                                       \
  for (; j < out; ++j) {                                                  \
    float acc = bias[j];                                                  \
    for (size_t i = 0; i < nnz; ++i) acc += val[i] * wt[idx[i] * out + j]; \
    y[j] = acc;                                                           \
  }

// y[0..n) += x[0..n)
#define CSLM_ADD_BODY \
  for (size_t i = 0; i < n; ++i) y[i] += x[i];

// y[0..n) = relu(init + x_0 + x_1 + ... + x_{k-1}), summed in that order: a
// first layer (b_1 and the premultiplied rows) in one pass, y written once.
#define CSLM_SUM_RELU_BODY(V, VU, W)                                      \
  const V zero = V{};                                                     \
  size_t i = 0;                                                           \
  for (; i + (W) <= n; i += (W)) {                                        \
    V acc = *reinterpret_cast<const VU*>(init + i);                       \
    for (size_t r = 0; r < k; ++r) acc += *reinterpret_cast<const VU*>(x[r] + i); \
    *reinterpret_cast<VU*>(y + i) = acc > zero ? acc : zero;              \
  }                                                                       \
  for (; i < n; ++i) {                                                    \
    float acc = init[i];                                                  \
    for (size_t r = 0; r < k; ++r) acc += x[r][i];                        \
    y[i] = acc > 0.0f ? acc : 0.0f;                                       \
  }

// y[0..n) = relu(init + x_0 + ... + x_{k-1} (+ extra, where not null)), n a multiple of 32, the rows x_r
// paired bfloat16 (above), each unit widened exactly to float32 and summed in that order: the same sums
// in every kernel.
#define CSLM_SUM_RELU_BF16_BODY(V, VU, W)                                 \
  typedef uint32_t VP __attribute__((vector_size((W) * 4), aligned(2), may_alias)); \
  const V zero = V{};                                                     \
  for (size_t j = 0; j < n; j += 32)                                      \
    for (size_t s = 0; s < 16; s += (W)) {                                \
      V lo = *reinterpret_cast<const VU*>(init + j + s);                  \
      V hi = *reinterpret_cast<const VU*>(init + j + 16 + s);             \
      for (size_t r = 0; r < k; ++r) {                                    \
        const VP pair = *reinterpret_cast<const VP*>(x[r] + j + 2 * s);   \
        lo += (V)(pair << 16);                                            \
        hi += (V)(pair & 0xffff0000u);                                    \
      }                                                                   \
      if (extra) {                                                        \
        lo += *reinterpret_cast<const VU*>(extra + j + s);                \
        hi += *reinterpret_cast<const VU*>(extra + j + 16 + s);           \
      }                                                                   \
      *reinterpret_cast<VU*>(y + j + s) = lo > zero ? lo : zero;          \
      *reinterpret_cast<VU*>(y + j + 16 + s) = hi > zero ? hi : zero;     \
    }

// y[0..n) += x[0..n), n a multiple of 32, x a paired bfloat16 row (a joint model's source table with kInt8)
#define CSLM_ADD_BF16_BODY(V, VU, W)                                      \
  typedef uint32_t VP __attribute__((vector_size((W) * 4), aligned(2), may_alias)); \
  for (size_t j = 0; j < n; j += 32)                                      \
    for (size_t s = 0; s < 16; s += (W)) {                                \
      const VP pair = *reinterpret_cast<const VP*>(x + j + 2 * s);        \
      *reinterpret_cast<VU*>(y + j + s) += (V)(pair << 16);               \
      *reinterpret_cast<VU*>(y + j + 16 + s) += (V)(pair & 0xffff0000u);  \
    }

// y[0..n) = max(y, 0), without a branch per element (a rectified unit is
// positive about half the time: a branch would be mispredicted as often)
#define CSLM_RELU_BODY(V, VU, W)                                          \
  const V zero = V{};                                                     \
  size_t i = 0;                                                           \
  for (; i + (W) <= n; i += (W)) {                                        \
    const V v = *reinterpret_cast<const VU*>(y + i);                      \
    *reinterpret_cast<VU*>(y + i) = v > zero ? v : zero;                  \
  }                                                                       \
  for (; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;

// kInt8 (cslm_local.h, "Precision"): r = the layer's input rounded to 8 bits,
// r[i] = round(x[i] / s_h), s_h = max x / 255, zero past n up to npad; returns
// s_h (0 for an input of zeros). x >= 0: a ReLU's output. W values at a
// time: adding and subtracting kRound (1.5 x 2^23) rounds a float in
// [0, 2^22) to the nearest integer, ties to even, as nearbyint does (which
// the compiler leaves to a library call per value: a quarter of the
// evaluator's time). A division, not a product with 1 / s_h: the compiler
// may fuse a product and the addition into one multiply-add, where the
// CPU has one, and round otherwise; every kernel must round alike.
#define CSLM_QUANTIZE_BODY(V, VU, W)                                      \
  typedef int32_t VI __attribute__((vector_size((W) * 4)));               \
  typedef uint8_t VB __attribute__((vector_size(W)));                     \
  const float kRound = 12582912.0f;                                       \
  V most = V{};                                                           \
  size_t i = 0;                                                           \
  for (; i + (W) <= n; i += (W)) {                                        \
    const V v = *reinterpret_cast<const VU*>(x + i);                      \
    most = v > most ? v : most;                                           \
  }                                                                       \
  float top = 0.0f;                                                       \
  for (size_t l = 0; l < (W); ++l) top = most[l] > top ? most[l] : top;   \
  for (size_t k = i; k < n; ++k) top = x[k] > top ? x[k] : top;           \
  if (top == 0.0f) {                                                      \
    std::memset(r, 0, npad);                                              \
    return 0.0f;                                                          \
  }                                                                       \
  const float sh = top / 255.0f;                                          \
  const V step = V{} + sh, round = V{} + kRound, most255 = V{} + 255.0f;  \
  for (i = 0; i + (W) <= n; i += (W)) {                                   \
    V v = (*reinterpret_cast<const VU*>(x + i) / step + round) - round;   \
    v = v < most255 ? v : most255;                                        \
    const VB b = __builtin_convertvector(__builtin_convertvector(v, VI), VB); \
    std::memcpy(r + i, &b, (W));                                          \
  }                                                                       \
  for (; i < n; ++i) {                                                    \
    const float v = (x[i] / sh + kRound) - kRound;                        \
    r[i] = static_cast<uint8_t>(v < 255.0f ? v : 255.0f);                 \
  }                                                                       \
  for (; i < npad; ++i) r[i] = 0;                                         \
  return sh;

// acc[j] = sum_i r[i] q_j[i] for j < out16, over groups of four inputs (the
// layout of Layer::q): exact in 32 bits for any order of the sums.
#define CSLM_GEMV_I8_BODY                                                 \
  for (size_t j = 0; j < out16; ++j) acc[j] = 0;                          \
  for (size_t g = 0; g < groups; ++g) {                                   \
    const uint8_t* rg = r + 4 * g;                                        \
    if (!(rg[0] | rg[1] | rg[2] | rg[3])) continue;                       \
    const int8_t* w = q + g * out16 * 4;                                  \
    for (size_t j = 0; j < out16; ++j)                                    \
      acc[j] += rg[0] * w[4 * j] + rg[1] * w[4 * j + 1] + rg[2] * w[4 * j + 2] +      \
                rg[3] * w[4 * j + 3];                                     \
  }

// y[j] = relu(bias[j] + acc[j] * (s_h * scale[j])), j < n; W at a time
#define CSLM_DEQUANT_RELU_BODY(V, VU, W)                                  \
  typedef int32_t VIu __attribute__((vector_size((W) * 4), aligned(4), may_alias)); \
  const V step = V{} + sh, zero = V{};                                    \
  size_t j = 0;                                                           \
  for (; j + (W) <= n; j += (W)) {                                        \
    const V v = *reinterpret_cast<const VU*>(bias + j) +                  \
                __builtin_convertvector(*reinterpret_cast<const VIu*>(acc + j), V) * \
                    (step * *reinterpret_cast<const VU*>(scale + j));     \
    *reinterpret_cast<VU*>(y + j) = v > zero ? v : zero;                  \
  }                                                                       \
  for (; j < n; ++j) {                                                    \
    const float v = bias[j] + static_cast<float>(acc[j]) * (sh * scale[j]); \
    y[j] = v > 0.0f ? v : 0.0f;                                           \
  }

#define CSLM_KERNELS(SUFFIX, ATTR, V, VU, W, NB)                                                        \
  ATTR float Dot##SUFFIX(size_t n, const float* __restrict x, const float* __restrict y) { CSLM_DOT_BODY } \
  ATTR void SparseGemv##SUFFIX(const float* __restrict wt, size_t out, const uint32_t* __restrict idx,   \
                               const float* __restrict val, size_t nnz, const float* __restrict bias,    \
                               float* __restrict y) { CSLM_GEMV_BODY(V, VU, W, NB) }                      \
  ATTR void Add##SUFFIX(size_t n, const float* __restrict x, float* __restrict y) { CSLM_ADD_BODY }     \
  ATTR void SumRelu##SUFFIX(size_t n, const float* const* __restrict x, size_t k,                        \
                            const float* __restrict init, float* __restrict y) { CSLM_SUM_RELU_BODY(V, VU, W) } \
  ATTR void SumReluBf16##SUFFIX(size_t n, const uint16_t* const* __restrict x, size_t k,                \
                                const float* __restrict extra, const float* __restrict init,             \
                                float* __restrict y) { CSLM_SUM_RELU_BF16_BODY(V, VU, W) }                \
  ATTR void AddBf16##SUFFIX(size_t n, const uint16_t* __restrict x, float* __restrict y) {               \
    CSLM_ADD_BF16_BODY(V, VU, W)                                                                       \
  }                                                                                                      \
  ATTR void Relu##SUFFIX(size_t n, float* __restrict y) { CSLM_RELU_BODY(V, VU, W) }                   \
  ATTR float Quantize##SUFFIX(size_t n, size_t npad, const float* __restrict x, uint8_t* __restrict r) {   \
    CSLM_QUANTIZE_BODY(V, VU, W)                                                                         \
  }                                                                                                      \
  ATTR void DequantRelu##SUFFIX(size_t n, const int32_t* __restrict acc, float sh,                       \
                                const float* __restrict scale, const float* __restrict bias,             \
                                float* __restrict y) { CSLM_DEQUANT_RELU_BODY(V, VU, W) }

CSLM_KERNELS(Base, , Vec4, Vec4u, 4, 8)  // NB: accumulators that fit the registers (16 xmm, 16 ymm, 32 zmm)
void GemvI8Base(const int8_t* __restrict q, size_t groups, size_t out16, const uint8_t* __restrict r,
                int32_t* __restrict acc) {
  CSLM_GEMV_I8_BODY
}
// GemvI8 of n <= kKernelRows histories, the h-th's input at r + h * stride and its sums at acc + h * stride:
// one history after another (the kernels without a batched product); the AMX and VNNI kernels stream the
// weights once for several (GemvI8AmxBatch, GemvI8VnniBatch).
template <void (*Gemv)(const int8_t*, size_t, size_t, const uint8_t*, int32_t*)>
void GemvI8Each(const int8_t* q, size_t groups, size_t out16, const uint8_t* r, int32_t* acc, size_t stride,
                size_t n) {
  for (size_t h = 0; h < n; ++h) Gemv(q, groups, out16, r + h * stride, acc + h * stride);
}
// Packs the nonzeros of a[begin..end): their indices to idx, their values to
// val, in order; returns how many. idx and val hold end - begin entries (a
// rectified layer is zero about half the time: a zero costs nothing in the
// sparse product).
size_t PackRange(size_t begin, size_t end, const float* __restrict a, uint32_t* __restrict idx,
                 float* __restrict val) {
  size_t nnz = 0;
  for (size_t i = begin; i < end; ++i) {
    idx[nnz] = static_cast<uint32_t>(i);
    val[nnz] = a[i];
    nnz += a[i] != 0;
  }
  return nnz;
}

size_t PackBase(size_t n, const float* __restrict a, uint32_t* __restrict idx, float* __restrict val) {
  return PackRange(0, n, a, idx, val);
}
#if CSLM_DISPATCH
CSLM_KERNELS(Avx2, CSLM_AVX2, Vec8, Vec8u, 8, 8)
CSLM_KERNELS(Avx512, CSLM_AVX512, Vec16, Vec16u, 16, 16)

// PackBase sixteen at a time with AVX-512's compress (the scalar loop
// stores every element and moves its index by a data-dependent count): the
// nonzeros of each sixteen, compressed in registers, stored whole (the store
// reaches at most 16 entries past nnz <= i, inside idx and val); the last
// n % 16 one by one.
CSLM_AVX512 size_t PackAvx512(size_t n, const float* __restrict a, uint32_t* __restrict idx,
                              float* __restrict val) {
  size_t nnz = 0, i = 0;
  __m512i ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i sixteen = _mm512_set1_epi32(16);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(a + i);
    const __mmask16 m = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ);  // a[i] != 0
    _mm512_storeu_ps(val + nnz, _mm512_maskz_compress_ps(m, v));
    _mm512_storeu_si512(idx + nnz, _mm512_maskz_compress_epi32(m, ids));
    nnz += static_cast<size_t>(__builtin_popcount(m));
    ids = _mm512_add_epi32(ids, sixteen);
  }
  return nnz + PackRange(i, n, a, idx + nnz, val + nnz);
}

// GemvI8 with AVX2, which has no u8 x s8 product that cannot saturate
// (vpmaddubsw's 16-bit sums can): per group of four inputs, r widened to
// 16 bits and broadcast, and vpmaddwd against four outputs' weights widened
// to 16 bits, which sums the products two by two into 32 bits; a final
// pairwise add (vphaddd) gives each output's sum. The sums are exact, as in
// CSLM_GEMV_I8_BODY; 32 outputs (8 registers) per pass over the groups.
CSLM_AVX2 void GemvI8Madd(const int8_t* __restrict q, size_t groups, size_t out16, const uint8_t* __restrict r,
                          int32_t* __restrict acc) {
  const uint32_t* r4 = reinterpret_cast<const uint32_t*>(r);
  for (size_t j = 0; j < out16; j += 32) {
    const size_t nb = out16 - j >= 32 ? 8 : 4;  // registers of four outputs (x two partial sums)
    __m256i s[8];
    for (size_t b = 0; b < 8; ++b) s[b] = _mm256_setzero_si256();
    for (size_t g = 0; g < groups; ++g) {
      if (!r4[g]) continue;
      const __m256i a = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(static_cast<int>(r4[g]))));
      const int8_t* w = q + (g * out16 + j) * 4;
      for (size_t b = 0; b < nb; ++b)
        s[b] = _mm256_add_epi32(s[b], _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(w + 16 * b))), a));
    }
    for (size_t b = 0; b < nb; b += 2)  // pairs summed; the 64-bit quarters put back in output order
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + j + 4 * b),
                          _mm256_permute4x64_epi64(_mm256_hadd_epi32(s[b], s[b + 1]), 0xD8));
  }
}

// GemvI8 with AVX-512 VNNI: per group of four inputs, their four bytes
// broadcast and vpdpbusd (u8 x s8, four products summed into each int32
// lane) against 16 outputs' weights per register, 16 registers (256
// outputs) per pass, so that each group's weights stream through once. A
// group of four zero inputs is skipped. The sums are CSLM_GEMV_I8_BODY's
// exactly: integers.
#define CSLM_VNNI __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma")))
CSLM_VNNI void GemvI8Vnni(const int8_t* __restrict q, size_t groups, size_t out16, const uint8_t* __restrict r,
                          int32_t* __restrict acc) {
  const uint32_t* r4 = reinterpret_cast<const uint32_t*>(r);
  size_t j = 0;
  for (; j + 256 <= out16; j += 256) {
    __m512i s[16];
    _Pragma("GCC unroll 16") for (int b = 0; b < 16; ++b) s[b] = _mm512_setzero_si512();
    for (size_t g = 0; g < groups; ++g) {
      if (!r4[g]) continue;
      const __m512i a = _mm512_set1_epi32(static_cast<int>(r4[g]));
      const int8_t* w = q + (g * out16 + j) * 4;
      _Pragma("GCC unroll 16") for (int b = 0; b < 16; ++b)
        s[b] = _mm512_dpbusd_epi32(s[b], a, _mm512_load_si512(w + 64 * b));
    }
    _Pragma("GCC unroll 16") for (int b = 0; b < 16; ++b) _mm512_storeu_si512(acc + j + 16 * b, s[b]);
  }
  for (; j < out16; j += 16) {
    __m512i s = _mm512_setzero_si512();
    for (size_t g = 0; g < groups; ++g)
      if (r4[g])
        s = _mm512_dpbusd_epi32(s, _mm512_set1_epi32(static_cast<int>(r4[g])),
                                _mm512_load_si512(q + (g * out16 + j) * 4));
    _mm512_storeu_si512(acc + j, s);
  }
}

// GemvI8Vnni for H histories at once: each group's weights, NB registers of
// 16 outputs, are loaded once and multiplied into every history's sums (H x NB
// accumulators), where one history at a time reloads them for each: on a layer
// of the paper's size (1,536 x 1,024, 1.5 MB) the weights come from the L3
// cache for every history. A group is skipped when it is zero for all H. The
// sums are exact, so each history's equal those of GemvI8Vnni alone.
template <int H, int NB>
CSLM_VNNI void GemvI8VnniRows(const int8_t* __restrict q, size_t groups, size_t out16, size_t j,
                              const uint32_t* const* r4, int32_t* const* acc) {
  __m512i s[H][NB];
  _Pragma("GCC unroll 8") for (int h = 0; h < H; ++h)
    _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) s[h][b] = _mm512_setzero_si512();
  for (size_t g = 0; g < groups; ++g) {
    uint32_t any = 0;
    _Pragma("GCC unroll 8") for (int h = 0; h < H; ++h) any |= r4[h][g];
    if (!any) continue;
    const int8_t* w = q + (g * out16 + j) * 4;
    __m512i wv[NB];
    _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) wv[b] = _mm512_load_si512(w + 64 * b);
    _Pragma("GCC unroll 8") for (int h = 0; h < H; ++h) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(r4[h][g]));
      _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) s[h][b] = _mm512_dpbusd_epi32(s[h][b], a, wv[b]);
    }
  }
  _Pragma("GCC unroll 8") for (int h = 0; h < H; ++h)
    _Pragma("GCC unroll 8") for (int b = 0; b < NB; ++b) _mm512_storeu_si512(acc[h] + j + 16 * b, s[h][b]);
}

// H histories over the outputs, 16 x NB at a time, the last out16 % (16 NB) sixteen at a time.
template <int H, int NB>
CSLM_VNNI void GemvI8VnniH(const int8_t* q, size_t groups, size_t out16, const uint32_t* const* r4,
                           int32_t* const* acc) {
  size_t j = 0;
  for (; j + 16 * NB <= out16; j += 16 * NB) GemvI8VnniRows<H, NB>(q, groups, out16, j, r4, acc);
  for (; j < out16; j += 16) GemvI8VnniRows<H, 1>(q, groups, out16, j, r4, acc);
}

// The widest pass whose H x NB sums, NB weights and a broadcast fit the 32
// registers, as measured: the paper's 1,536 x 1,024 layer with real inputs
// (20,000 test.tok.fr histories, a standalone microbenchmark on a 2-core AMD
// EPYC with AVX-512 VNNI) took per history 15.3 us alone; two at a time 14.9
// with NB = 8 (22.3 with NB = 2: a group's weights reloaded for every 32
// outputs, and a group skipped only when zero for both), three 13.1, four
// 10.5 (NB = 4), six 9.3, eight 9.1 (NB = 2). More than eight go eight at a time.
CSLM_VNNI void GemvI8VnniBatch(const int8_t* q, size_t groups, size_t out16, const uint8_t* r, int32_t* acc,
                               size_t stride, size_t n) {
  for (; n > 0; r += 8 * stride, acc += 8 * stride, n -= std::min<size_t>(n, 8)) {
    const uint32_t* r4[8];
    int32_t* a[8];
    for (size_t h = 0; h < n && h < 8; ++h) {
      r4[h] = reinterpret_cast<const uint32_t*>(r + h * stride);
      a[h] = acc + h * stride;
    }
    switch (std::min<size_t>(n, 8)) {
      case 1: GemvI8Vnni(q, groups, out16, r, acc); break;
      case 2: GemvI8VnniH<2, 8>(q, groups, out16, r4, a); break;
      case 3: GemvI8VnniH<3, 8>(q, groups, out16, r4, a); break;
      case 4: GemvI8VnniH<4, 4>(q, groups, out16, r4, a); break;
      case 5: GemvI8VnniH<5, 4>(q, groups, out16, r4, a); break;
      case 6: GemvI8VnniH<6, 4>(q, groups, out16, r4, a); break;
      case 7: GemvI8VnniH<7, 2>(q, groups, out16, r4, a); break;
      default: GemvI8VnniH<8, 2>(q, groups, out16, r4, a); break;
    }
  }
}
#endif

#if CSLM_AMX_DISPATCH
// GemvI8 of up to 16 histories with AMX (Intel's Advanced Matrix Extensions):
// their inputs are the rows of tile A (n x 64 bytes: 64 inputs each, `stride`
// apart), and a tile B holds 16 groups of four inputs of 16 outputs (16 rows
// of 64 bytes) read from Layer::q as it is, one row per group, out16 x 4 bytes
// apart. tdpbusd adds A's u8 x B's s8 products, four at a time, into tile C's
// n x 16 int32 sums: the histories' sums of those 16 outputs. Four C tiles
// take 64 outputs a pass over the groups (tiles 0-3), A one tile (4), B
// three (5-7). The sums are exact, CSLM_GEMV_I8_BODY's: the layer's inputs
// are padded with zeros to in64, a multiple of 64 (Layer::q's groups, and each
// history's r).
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];  // a tile's bytes a row
  uint8_t rows[16];
};
CSLM_AMX void GemvI8Amx(const int8_t* q, size_t groups, size_t out16, const uint8_t* r, int32_t* acc,
                        size_t stride, size_t n) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = static_cast<uint8_t>(t < 5 ? n : 16);  // C and A: a row per history; B: 16 groups
  }
  _tile_loadconfig(&cfg);
  const size_t ldq = out16 * 4, blocks = groups / 16;  // Layer::q's bytes a group; 64 inputs a block
  size_t j = 0;
  for (; j + 64 <= out16; j += 64) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (size_t k = 0; k < blocks; ++k) {
      const int8_t* w = q + (16 * k * out16 + j) * 4;
      _tile_loadd(4, r + 64 * k, stride);
      _tile_loadd(5, w, ldq);
      _tile_dpbusd(0, 4, 5);
      _tile_loadd(6, w + 64, ldq);
      _tile_dpbusd(1, 4, 6);
      _tile_loadd(7, w + 128, ldq);
      _tile_dpbusd(2, 4, 7);
      _tile_loadd(5, w + 192, ldq);
      _tile_dpbusd(3, 4, 5);
    }
    _tile_stored(0, acc + j, stride * 4);
    _tile_stored(1, acc + j + 16, stride * 4);
    _tile_stored(2, acc + j + 32, stride * 4);
    _tile_stored(3, acc + j + 48, stride * 4);
  }
  for (; j < out16; j += 16) {  // the last out16 % 64, 16 at a time
    _tile_zero(0);
    for (size_t k = 0; k < blocks; ++k) {
      _tile_loadd(4, r + 64 * k, stride);
      _tile_loadd(5, q + (16 * k * out16 + j) * 4, ldq);
      _tile_dpbusd(0, 4, 5);
    }
    _tile_stored(0, acc + j, stride * 4);
  }
  _tile_release();
}

// AMX's cost is about that of a tile of 16 rows however many it holds, so
// fewer than eight histories go to VNNI's product (GemvI8VnniBatch). The
// paper's 1,536 x 1,024 layer, per history (a standalone microbenchmark, 2-core
// Intel Xeon with AMX, a virtual machine, the weights in the cache; six runs,
// the best of five passes each): VNNI 20-25 us alone, 10-11 four or eight at a
// time; AMX 23-26 alone, 6-7 four at a time, 3.1-3.6 eight, 1.7 sixteen in
// four runs, and about five times as long in the other two (VNNI's four or
// eight 15-20 then): from eight on AMX was the faster in every run.
CSLM_AMX void GemvI8AmxBatch(const int8_t* q, size_t groups, size_t out16, const uint8_t* r, int32_t* acc,
                             size_t stride, size_t n) {
  if (n < 8)
    GemvI8VnniBatch(q, groups, out16, r, acc, stride, n);
  else
    GemvI8Amx(q, groups, out16, r, acc, stride, n);
}

// True where the CPU has AMX's tiles and 8-bit products and Linux lets this
// process use them (arch_prctl's ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA,
// Linux 5.16 and later; asked once, for every thread).
bool AmxUsable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif

// CpuKernels' choice (cslm_kernels.h), made once.
Kernels PickKernels() {
  const char* cap = getenv("CSLM_KERNELS");
  const std::string want = cap ? cap : "";
  if (!want.empty() && want != "amx" && want != "avx512" && want != "avx2" && want != "baseline")
    throw std::invalid_argument("CSLM_KERNELS=" + want +
                                ": not amx, avx512, avx2 or baseline (unset it for the CPU's widest)");
#if CSLM_DISPATCH
  __builtin_cpu_init();
  if ((want.empty() || want == "amx" || want == "avx512") && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512vl")) {
    Kernels k = {DotAvx512, SparseGemvAvx512, AddAvx512, SumReluAvx512, SumReluBf16Avx512, AddBf16Avx512,
                 ReluAvx512, PackAvx512, QuantizeAvx512, GemvI8Each<GemvI8Madd>, DequantReluAvx512, "avx512"};
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) {
      k.gemv_i8_batch = GemvI8VnniBatch;
#if CSLM_AMX_DISPATCH
      if (want != "avx512" && AmxUsable()) {
        k.gemv_i8_batch = GemvI8AmxBatch;
        k.name = "amx";
      }
#endif
    }
    return k;
  }
  if (want != "baseline" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    Kernels k = {DotAvx2, SparseGemvAvx2, AddAvx2, SumReluAvx2, SumReluBf16Avx2, AddBf16Avx2,
                 ReluAvx2, PackBase, QuantizeAvx2, GemvI8Each<GemvI8Madd>, DequantReluAvx2, "avx2"};
    return k;
  }
#endif
  Kernels k = {DotBase, SparseGemvBase, AddBase, SumReluBase, SumReluBf16Base, AddBf16Base,
               ReluBase, PackBase, QuantizeBase, GemvI8Each<GemvI8Base>, DequantReluBase, "baseline"};
  return k;
}

}  // namespace

const Kernels& CpuKernels() {
  static const Kernels kernels = PickKernels();
  return kernels;
}

}  // namespace cslm
