// cslm_kernels.h -- the arithmetic of the in-process evaluator (cslm_local.h):
// the first layer's sums of premultiplied rows, the float32 layers' sparse
// products, the 8-bit layers' rounding and integer products, the output row.
// No dependency beyond C++11.
//
// Each kernel is compiled for AVX-512 (its 8-bit product also for AVX-512 VNNI
// and for AMX's tiles), for AVX2 + FMA and for baseline x86-64 (or once,
// plainly, elsewhere); CpuKernels() picks, once, the widest set the CPU runs, so
// that a binary built for any x86-64 (as Moses is) uses the vector units the
// machine has. Every set sums in the same order: the 8-bit products are exact
// integers, and a history's values do not depend on how many are computed
// together.
//
//   const cslm::Kernels& k = cslm::CpuKernels();   // std::invalid_argument on a bad CSLM_KERNELS
//   float s = k.dot(n, x, y);
#ifndef CSLM_KERNELS_H_
#define CSLM_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include <cstring>

namespace cslm {

// The most histories gemv_i8_batch takes in one call (AMX's tile rows).
const size_t kKernelRows = 16;

// One set of kernels. Pointers need not be aligned unless said; no output
// overlaps an input.
struct Kernels {
  // x . y over n floats, summed in 16 partial sums
  float (*dot)(size_t n, const float* x, const float* y);
  // y[j] = bias[j] + sum_i val[i] * wt[idx[i] * out + j], j < out, each summed in i order: a layer's product
  // with its nonzero inputs only (pack's idx and val), wt the layer's weights transposed
  void (*gemv)(const float* wt, size_t out, const uint32_t* idx, const float* val, size_t nnz, const float* bias,
               float* y);
  // y[0..n) += x[0..n)
  void (*add)(size_t n, const float* x, float* y);
  // y[0..n) = relu(init + x_0 + x_1 + ... + x_{k-1}), summed in that order
  void (*sum_relu)(size_t n, const float* const* x, size_t k, const float* init, float* y);
  // the same over k paired bfloat16 rows (PairedIndex), plus extra (n floats) last where not null; n a
  // multiple of 32
  void (*sum_relu_bf16)(size_t n, const uint16_t* const* x, size_t k, const float* extra, const float* init,
                        float* y);
  // y[0..n) += x, a paired bfloat16 row; n a multiple of 32
  void (*add_bf16)(size_t n, const uint16_t* x, float* y);
  // y[0..n) = max(y, 0)
  void (*relu)(size_t n, float* y);
  // The nonzeros of a[0..n): their indices to idx, their values to val, in order; returns how many. idx and
  // val hold n entries each.
  size_t (*pack)(size_t n, const float* a, uint32_t* idx, float* val);
  // An 8-bit layer's input x[0..n) >= 0 (a ReLU's output) rounded: r[i] = round(x[i] / s_h) in 0..255 (ties
  // to even), s_h = max x / 255, zero from n up to npad; returns s_h (0 for an input of zeros)
  float (*quantize)(size_t n, size_t npad, const float* x, uint8_t* r);
  // acc_h[j] = sum_i r_h[i] q_j[i], j < out16, exact in 32 bits, for n <= kKernelRows histories: the h-th's
  // rounded input at r + h * stride and its sums at acc + h * stride. q holds a layer's weights in groups of
  // four inputs, q[(g * out16 + j) * 4 + t] = q_j[4g + t], g < groups; groups a multiple of 16 (the inputs
  // padded with zeros to a multiple of 64), out16 a multiple of 16, q on a 64-byte boundary.
  void (*gemv_i8_batch)(const int8_t* q, size_t groups, size_t out16, const uint8_t* r, int32_t* acc,
                        size_t stride, size_t n);
  // y[j] = relu(bias[j] + acc[j] * (sh * scale[j])), j < n
  void (*dequant_relu)(size_t n, const int32_t* acc, float sh, const float* scale, const float* bias, float* y);
  // "amx" (the AVX-512 set, its 8-bit products in AMX tiles from eight histories on), "avx512", "avx2" or
  // "baseline"
  const char* name;
};

// The widest set the CPU runs, at most the one the environment's CSLM_KERNELS names ("amx", "avx512",
// "avx2" or "baseline"; unset or empty: no limit), so that the narrower ones can be timed on the same
// machine, as MKL_ENABLE_INSTRUCTIONS does for MKL. Picked at the first call; throws std::invalid_argument
// (at every call) on another CSLM_KERNELS value.
const Kernels& CpuKernels();

// A float32 rounded to the nearest bfloat16, ties to even (a NaN stays a NaN).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Where a unit's bfloat16 entry lies in a paired row: in blocks of 32 units, the 16-bit entries 2i and 2i+1
// of a block starting at unit j hold units j+i and j+16+i (i < 16). A 32-bit lane of such a row then holds
// two units, and each widens to float32 exactly with one operation: shifted up (the first) or masked (the
// second). Every kernel set reads a block as whole vectors of such lanes (one for AVX-512, two for AVX2,
// four for the baseline).
inline size_t PairedIndex(size_t unit) {
  const size_t i = unit % 32;
  return unit - i + (i < 16 ? 2 * i : 2 * (i - 16) + 1);
}

}  // namespace cslm

#endif  // CSLM_KERNELS_H_
