// cslm_local.cc -- see cslm_local.h.
#include "cslm_local.h"

#include "cslm_json.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
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

std::runtime_error Fail(const std::string& file, const std::string& why) {
  return std::runtime_error(file + ": " + why);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path.c_str(), std::ios::binary);
  if (!in) throw Fail(path, "cannot read (is the path a `cslm train` model directory?)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// One tensor of a safetensors file: dtype, shape, byte range of the data.
struct TensorInfo {
  std::string dtype;
  std::vector<size_t> shape;
  size_t begin, end;
};

// A whole number >= 0 from a JSON value, or a one-line error naming the file and what it is.
size_t WholeNumber(const Json& v, const std::string& file, const std::string& what) {
  if (!v.is_number() || v.number() < 0 || v.number() != static_cast<double>(static_cast<size_t>(v.number())))
    throw Fail(file, what + " is not a whole number >= 0");
  return static_cast<size_t>(v.number());
}

// The entry `"name": {"dtype": ..., "shape": [...], "data_offsets": [a, b]}` of a
// safetensors header. Returns false if the name is absent.
bool FindTensor(const Json& header, const std::string& name, TensorInfo* t, const std::string& file) {
  const Json* entry = header.Find(name);
  if (!entry) return false;
  const Json* dtype = entry->Find("dtype");
  const Json* shape = entry->Find("shape");
  const Json* offsets = entry->Find("data_offsets");
  if (!dtype || !dtype->is_string()) throw Fail(file, name + " has no dtype");
  if (!shape || !shape->is_array()) throw Fail(file, name + " has no shape");
  if (!offsets || !offsets->is_array() || offsets->array().size() != 2)
    throw Fail(file, name + ": data_offsets must have two numbers");
  t->dtype = dtype->string();
  t->shape.clear();
  for (size_t i = 0; i < shape->array().size(); ++i)
    t->shape.push_back(WholeNumber(shape->array()[i], file, name + "'s shape"));
  t->begin = WholeNumber(offsets->array()[0], file, name + "'s data_offsets");
  t->end = WholeNumber(offsets->array()[1], file, name + "'s data_offsets");
  return true;
}

// The float32 tensors of a safetensors file (little-endian), by name.
class SafeTensors {
 public:
  explicit SafeTensors(const std::string& path) : path_(path), blob_(ReadFile(path)) {
    if (blob_.size() < 8) throw Fail(path, "too short for a safetensors file");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(blob_[i]);
    if (n > blob_.size() - 8) throw Fail(path, "header length beyond the end of the file (truncated?)");
    header_ = Json::Parse(blob_.substr(8, n), path);
    if (!header_.is_object()) throw Fail(path, "the header is not a JSON object");
    data_ = 8 + n;
  }
  bool Has(const std::string& name) const {
    TensorInfo t;
    return FindTensor(header_, name, &t, path_);
  }
  // Copies tensor `name` (float32, `dims` dimensions) into out; returns its shape.
  std::vector<size_t> Get(const std::string& name, size_t dims, Floats* out) const {
    TensorInfo t;
    if (!FindTensor(header_, name, &t, path_)) throw Fail(path_, "no tensor " + name);
    if (t.dtype != "F32") throw Fail(path_, name + " is " + t.dtype + ", expected F32");
    if (t.shape.size() != dims) throw Fail(path_, name + " has the wrong number of dimensions");
    size_t count = 1;
    for (size_t i = 0; i < t.shape.size(); ++i) count *= t.shape[i];
    if (t.end < t.begin || t.end - t.begin != count * 4 || data_ + t.end > blob_.size())
      throw Fail(path_, name + ": byte range does not match its shape (truncated file?)");
    out->resize(count);
    if (count) std::memcpy(&(*out)[0], blob_.data() + data_ + t.begin, count * 4);
    return t.shape;
  }

 private:
  std::string path_, blob_;
  Json header_;
  size_t data_;
};

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

// A float32 rounded to the nearest bfloat16, ties to even (a NaN stays a NaN).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// kInt8's first-layer tables in bfloat16, in blocks of 32 units, paired: in a row, the 16-bit entries 2i
// and 2i+1 of a block starting at unit j hold units j+i and j+16+i (i < 16). A 32-bit lane of such a row then
// holds two units, and each widens to float32 exactly with one operation: shifted up (the first) or masked
// (the second). Every kernel reads a block as whole vectors of such lanes (one for AVX-512, two for AVX2,
// four for the baseline).
inline size_t PairedIndex(size_t unit) {
  const size_t i = unit % 32;
  return unit - i + (i < 16 ? 2 * i : 2 * (i - 16) + 1);
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
// GemvI8 of n <= kBatch histories, the h-th's input at r + h * stride and its sums at acc + h * stride: one
// history after another (the kernels without a batched product); the AMX and VNNI kernels stream the weights
// once for several (GemvI8AmxBatch, GemvI8VnniBatch).
const size_t kBatch = LocalModel::kBatch;
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

struct Kernels {
  float (*dot)(size_t, const float*, const float*);
  void (*gemv)(const float*, size_t, const uint32_t*, const float*, size_t, const float*, float*);
  void (*add)(size_t, const float*, float*);
  void (*sum_relu)(size_t, const float* const*, size_t, const float*, float*);
  void (*sum_relu_bf16)(size_t, const uint16_t* const*, size_t, const float*, const float*, float*);
  void (*add_bf16)(size_t, const uint16_t*, float*);
  void (*relu)(size_t, float*);
  size_t (*pack)(size_t, const float*, uint32_t*, float*);
  float (*quantize)(size_t, size_t, const float*, uint8_t*);
  void (*gemv_i8_batch)(const int8_t*, size_t, size_t, const uint8_t*, int32_t*, size_t, size_t);
  void (*dequant_relu)(size_t, const int32_t*, float, const float*, const float*, float*);
  const char* name;
};

// The widest kernels the CPU runs, at most those the environment's CSLM_KERNELS names ("amx", "avx512",
// "avx2" or "baseline"; unset or empty: no limit), so that the narrower ones can be timed on the same machine,
// as MKL_ENABLE_INSTRUCTIONS does for MKL. Another value is refused (std::invalid_argument). "amx": the
// AVX-512 kernels, with kInt8's products in AMX tiles.
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

const Kernels& K() {
  static const Kernels kernels = PickKernels();
  return kernels;
}

}  // namespace

std::vector<std::string> ReadVocabulary(const std::string& path) {
  std::ifstream in(path.c_str());
  if (!in) throw Fail(path, "cannot read");
  std::vector<std::string> words;
  std::string line;
  while (std::getline(in, line)) words.push_back(line.substr(0, line.find('\t')));
  return words;
}

namespace {
// The ids of <s>, </s> and [UNK] in a vocabulary read from `path`; throws naming it if one is missing.
void SpecialIds(const std::vector<std::string>& words, const std::string& path, uint32_t* bos, uint32_t* eos,
                uint32_t* unk) {
  std::map<std::string, uint32_t> special;
  for (size_t i = 0; i < words.size(); ++i)
    if (words[i] == "<s>" || words[i] == "</s>" || words[i] == "[UNK]") special[words[i]] = static_cast<uint32_t>(i);
  if (special.size() != 3) throw Fail(path, "must hold <s>, </s> and [UNK]");
  *bos = special["<s>"];
  *eos = special["</s>"];
  *unk = special["[UNK]"];
}
}  // namespace

bool ParsePrecision(const std::string& name, Precision* precision) {
  if (name == "fp32") *precision = kFloat32;
  else if (name == "int8") *precision = kInt8;
  else return false;
  return true;
}

LocalModel::LocalModel(const std::string& dir, Precision precision)
    : precision_(precision), order_(0), window_(0), embed_(0), h1_(0), self_norm_(0), nce_(false), bos_(0), eos_(0),
      unk_(0), src_bos_(0), src_eos_(0), src_unk_(0) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/model.safetensors", voc_path = dir + "/cslm.vocab",
                    src_voc_path = dir + "/cslm.src.vocab";
  const Json cfg = Json::Parse(ReadFile(cfg_path), cfg_path);
  const Json* format = cfg.Find("format");
  if (!format || !format->is_string() || format->string() != "cslm")
    throw Fail(cfg_path, "not a CSLM model directory (format is not \"cslm\")");
  const Json* model = cfg.Find("model");
  const Json* order = model ? model->Find("order") : 0;
  if (!order || !order->is_number() || order->number() < 2 || order->number() > 64 ||
      order->number() != static_cast<unsigned>(order->number()))
    throw Fail(cfg_path, "no valid \"order\" in \"model\"");
  order_ = static_cast<unsigned>(order->number());
  // A joint model (NNJM): m source words follow the target history in each row; absent or 0 for a plain CSLM.
  const Json* window = model->Find("source_window");
  if (window) {
    const size_t m = WholeNumber(*window, cfg_path, "\"source_window\" in \"model\"");
    if (m > 1024) throw Fail(cfg_path, "\"source_window\" in \"model\" is too large");
    window_ = static_cast<unsigned>(m);
  }
  const Json* meta = cfg.Find("meta");
  const Json* train = meta ? meta->Find("train_config") : 0;
  const Json* self_norm = train ? train->Find("self_norm") : 0;
  const Json* objective = train ? train->Find("objective") : 0;
  self_norm_ = self_norm && self_norm->is_number() ? self_norm->number() : 0;
  // trained by noise-contrastive estimation (cslm train --objective nce): self-normalised as well
  nce_ = objective && objective->is_string() && objective->string() == "nce";

  words_ = ReadVocabulary(voc_path);
  SpecialIds(words_, voc_path, &bos_, &eos_, &unk_);
  if (window_) {
    src_words_ = ReadVocabulary(src_voc_path);
    SpecialIds(src_words_, src_voc_path, &src_bos_, &src_eos_, &src_unk_);
    const Json* size = model->Find("source_vocab_size");
    if (size && WholeNumber(*size, cfg_path, "\"source_vocab_size\" in \"model\"") != src_words_.size()) {
      std::ostringstream m;
      m << "has " << src_words_.size() << " words but " << cfg_path << " says \"source_vocab_size\": " << size->number();
      throw Fail(src_voc_path, m.str());
    }
  }
  const size_t V = words_.size(), C = order_ - 1, M = window_, Vs = src_words_.size();

  SafeTensors st(st_path);
  Floats embed, src_embed, w1;
  std::vector<size_t> s = st.Get("embed.weight", 2, &embed);
  if (s[0] != V) {
    std::ostringstream m;
    m << "embed.weight has " << s[0] << " rows but " << voc_path << " has " << V << " words";
    throw Fail(st_path, m.str());
  }
  embed_ = s[1];
  if (M) {
    if (!st.Has("src_embed.weight")) throw Fail(st_path, "no tensor src_embed.weight (a joint model's source embedding)");
    s = st.Get("src_embed.weight", 2, &src_embed);
    if (s[0] != Vs || s[1] != embed_) {
      std::ostringstream m;
      m << "src_embed.weight is " << s[0] << " x " << s[1] << " but " << src_voc_path << " has " << Vs
        << " words of projection size " << embed_;
      throw Fail(st_path, m.str());
    }
  }
  s = st.Get("hidden.0.weight", 2, &w1);
  h1_ = s[0];
  if (s[1] != (C + M) * embed_)
    throw Fail(st_path, "hidden.0.weight does not take order-1 (+ source_window) projections (order in config.json?)");
  st.Get("hidden.0.bias", 1, &b1_);

  // T_p[w] = W_1[:, p*E:(p+1)*E] . embed[w]: the first layer's share of history
  // position p, for every word (cslm/model.py `first_layer_tables`); a joint
  // model's source positions q = C .. C+M-1 likewise with src_embed, into S.
  // With kInt8 they are kept in bfloat16 (cslm_local.h, "Precision"): each row computed in float32, then rounded.
  const bool bf16 = precision_ == kInt8;
  h1p_ = (h1_ + 31) / 32 * 32;
  if (bf16) {  // rows of h1p_ entries, paired (PairedIndex), the padding zero
    table16_.resize(C * V * h1p_);
    src_table16_.resize(M * Vs * h1p_);
    b1_.resize(h1p_, 0.0f);  // b_1 padded with zeros, as the rows are (the float32 path reads its first h1_)
  } else {
    table_.resize(C * V * h1_);
    src_table_.resize(M * Vs * h1_);
  }
  Floats row(h1_);
  const size_t width = (C + M) * embed_;
  std::vector<float> w1t(embed_ * h1_);  // W_1's block of position p, transposed: [e][j]
  std::vector<uint32_t> all(embed_);
  for (size_t e = 0; e < embed_; ++e) all[e] = static_cast<uint32_t>(e);
  const std::vector<float> zero(h1_, 0.0f);
  for (size_t p = 0; p < C + M; ++p) {
    for (size_t j = 0; j < h1_; ++j)
      for (size_t e = 0; e < embed_; ++e) w1t[e * h1_ + j] = w1[j * width + p * embed_ + e];
    const bool source = p >= C;
    const size_t rows = source ? Vs : V, first = source ? (p - C) * Vs : p * V;  // the position's first row
    const float* emb = source ? &src_embed[0] : &embed[0];
    for (size_t w = 0; w < rows; ++w) {
      K().gemv(&w1t[0], h1_, &all[0], emb + w * embed_, embed_, &zero[0], &row[0]);
      if (bf16) {
        uint16_t* out = &(source ? src_table16_ : table16_)[(first + w) * h1p_];
        for (size_t j = 0; j < h1_; ++j) out[PairedIndex(j)] = FloatToBf16(row[j]);
      } else {
        std::copy(row.begin(), row.end(), (source ? src_table_ : table_).begin() + (first + w) * h1_);
      }
    }
  }

  size_t in = h1_;
  for (size_t k = 1; st.Has("hidden." + std::to_string(k) + ".weight"); ++k) {
    Layer L;
    Floats w;
    s = st.Get("hidden." + std::to_string(k) + ".weight", 2, &w);
    if (s[1] != in) throw Fail(st_path, "hidden layer sizes do not chain");
    L.in = s[1];
    L.out = s[0];
    L.in64 = (L.in + 63) / 64 * 64;
    L.out16 = (L.out + 15) / 16 * 16;
    if (precision_ == kInt8) {
      // W_k[j][i] ~ s_j q_j[i] (cslm_local.h, "Precision"), in groups of four inputs per output. A sum of
      // in x 255 x 127 must fit 32 bits.
      if (L.in > 65536) throw Fail(st_path, "hidden layer " + std::to_string(k) + " is too wide for precision int8");
      L.q.assign(L.in64 * L.out16, 0);
      L.scale.assign(L.out, 0.0f);
      for (size_t j = 0; j < L.out; ++j) {
        float top = 0.0f;
        for (size_t i = 0; i < L.in; ++i) top = std::max(top, std::fabs(w[j * L.in + i]));
        L.scale[j] = top / 127.0f;
        if (top == 0.0f) continue;
        for (size_t i = 0; i < L.in; ++i)
          L.q[((i / 4) * L.out16 + j) * 4 + i % 4] =
              static_cast<int8_t>(std::nearbyint(w[j * L.in + i] * (127.0f / top)));
      }
    } else {
      L.wt.resize(L.in * L.out);
      for (size_t j = 0; j < L.out; ++j)
        for (size_t i = 0; i < L.in; ++i) L.wt[i * L.out + j] = w[j * L.in + i];
    }
    st.Get("hidden." + std::to_string(k) + ".bias", 1, &L.bias);
    in = L.out;
    layers_.push_back(L);
  }
  s = st.Get("out.weight", 2, &out_w_);
  if (s[0] != V || s[1] != in) throw Fail(st_path, "out.weight does not match the vocabulary and the last hidden layer");
  st.Get("out.bias", 1, &out_b_);
  out_wt_.resize(out_w_.size());  // transposed, for the whole softmax as one product
  for (size_t v = 0; v < V; ++v)
    for (size_t k = 0; k < in; ++k) out_wt_[k * V + v] = out_w_[v * in + k];
}

const char* LocalModel::Kernels() { return K().name; }

void LocalModel::FirstLayer(const uint32_t* history, float* a, Scratch* scratch) const {
  const size_t V = words_.size(), C = order_ - 1;
  const float* source = window_ ? SourceSum(history + C, scratch) : nullptr;
  if (precision_ == kInt8) {  // the tables in bfloat16
    const uint16_t* rows[64];  // order <= 64 (checked at load)
    for (size_t p = 0; p < C; ++p) rows[p] = &table16_[(p * V + history[p]) * h1p_];
    K().sum_relu_bf16(h1p_, rows, C, source, &b1_[0], a);  // a: h1p_ floats, the padding's zero
    return;
  }
  const float* rows[65];  // order <= 64 (checked at load): the history's rows and the source window's sum
  for (size_t p = 0; p < C; ++p) rows[p] = &table_[(p * V + history[p]) * h1_];
  size_t k = C;
  if (source) rows[k++] = source;
  K().sum_relu(h1_, rows, k, &b1_[0], a);  // h_1 = relu(b_1 + sum_p T_p[w_p] + sum_q S_q[s_q])
}

void LocalModel::Hidden(const uint32_t* history, float* h, Scratch* scratch) const {
  if (precision_ == kInt8) {  // a batch of one
    HiddenBatch(&history, 1, &h, scratch);
    return;
  }
  Floats& a = scratch->a;
  a.resize(h1_);
  FirstLayer(history, &a[0], scratch);
  Floats& b = scratch->b;
  Floats& val = scratch->val;
  std::vector<uint32_t>& idx = scratch->idx;
  for (size_t l = 0; l < layers_.size(); ++l) {  // h_k = relu(W_k h_{k-1} + b_k)
    const Layer& L = layers_[l];
    b.resize(L.out);
    idx.resize(L.in);
    val.resize(L.in);
    const size_t nnz = K().pack(L.in, &a[0], &idx[0], &val[0]);  // rectified zeros cost nothing: the others, packed
    K().gemv(&L.wt[0], L.out, &idx[0], &val[0], nnz, &L.bias[0], &b[0]);
    K().relu(L.out, &b[0]);
    a.swap(b);
  }
  std::memcpy(h, &a[0], hidden_size() * sizeof(float));
}

void LocalModel::HiddenBatch(const uint32_t* const* histories, size_t n, float* const* h, Scratch* s) const {
  if (precision_ != kInt8) {  // one at a time: the sparse products of float32
    for (size_t i = 0; i < n; ++i) Hidden(histories[i], h[i], s);
    return;
  }
  // each history's vectors `stride` apart, whole cache lines: a layer's input and output, its rounded input,
  // its sums (every width at most the widest layer's, padded to 64)
  size_t stride = h1_;
  for (size_t l = 0; l < layers_.size(); ++l) stride = std::max(stride, layers_[l].out16);
  stride = (stride + 63) / 64 * 64;
  s->batch_a.resize(n * stride);
  s->batch_b.resize(n * stride);
  s->batch_r.resize(n * stride);
  s->batch_acc.resize(n * stride);
  float* a = &s->batch_a[0];
  float* b = &s->batch_b[0];
  uint8_t* r = &s->batch_r[0];
  int32_t* acc = &s->batch_acc[0];
  float sh[kBatch];
  for (size_t i = 0; i < n; ++i) FirstLayer(histories[i], a + i * stride, s);
  for (size_t l = 0; l < layers_.size(); ++l) {  // h_k[j] = relu(b_k[j] + s_h s_j sum_i r[i] q_j[i]) ("Precision")
    const Layer& L = layers_[l];
    for (size_t i = 0; i < n; ++i) sh[i] = K().quantize(L.in, L.in64, a + i * stride, r + i * stride);
    K().gemv_i8_batch(&L.q[0], L.in64 / 4, L.out16, r, acc, stride, n);
    for (size_t i = 0; i < n; ++i)
      K().dequant_relu(L.out, acc + i * stride, sh[i], &L.scale[0], &L.bias[0], b + i * stride);
    std::swap(a, b);
  }
  for (size_t i = 0; i < n; ++i) std::memcpy(h[i], a + i * stride, hidden_size() * sizeof(float));
}

const float* LocalModel::SourceSum(const uint32_t* window, Scratch* s) const {
  // sum_q S_q[s_q], summed in q order whether it was cached or not: the scores
  // do not depend on what the cache held
  if (s->src_keys.size() != kSourceSlots * window_) {
    s->src_keys.assign(kSourceSlots * window_, 0xffffffffu);  // no word has this id: every slot empty
    s->src_values.resize(kSourceSlots * h1p_);
  }
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the ids
  for (size_t q = 0; q < window_; ++q) hash = (hash ^ window[q]) * 1099511628211ull;
  const size_t slot = static_cast<size_t>((hash ^ (hash >> 29)) % kSourceSlots);
  uint32_t* key = &s->src_keys[slot * window_];
  float* sum = &s->src_values[slot * h1p_];
  if (std::equal(window, window + window_, key)) return sum;
  const size_t Vs = src_words_.size();
  std::fill(sum, sum + h1p_, 0.0f);
  for (size_t q = 0; q < window_; ++q) {
    if (precision_ == kInt8)
      K().add_bf16(h1p_, &src_table16_[(q * Vs + window[q]) * h1p_], sum);
    else
      K().add(h1_, &src_table_[(q * Vs + window[q]) * h1_], sum);
  }
  std::copy(window, window + window_, key);
  return sum;
}

float LocalModel::Activation(const float* h, uint32_t word) const {
  const size_t H = hidden_size();
  return K().dot(H, &out_w_[word * H], h) + out_b_[word];  // o_w = out_w . h + c_w
}

float LocalModel::LogNormaliser(const float* h, Scratch* scratch) const {
  const size_t V = words_.size(), H = hidden_size();
  std::vector<uint32_t>& idx = scratch->idx;
  Floats& val = scratch->a;
  idx.resize(H);
  val.resize(H);
  const size_t nnz = K().pack(H, h, &idx[0], &val[0]);  // the rectified layer's nonzeros, packed
  Floats& o = scratch->b;
  o.resize(V);
  K().gemv(&out_wt_[0], V, &idx[0], &val[0], nnz, &out_b_[0], &o[0]);  // every o_v = out_v . h + c_v
  const float top = *std::max_element(o.begin(), o.end());
  double z = 0;
  for (size_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(o[v] - top));
  return top + static_cast<float>(std::log(z));  // ln Z = ln sum_v exp(o_v)
}

namespace {
uint64_t HistoryHash(const uint32_t* history, size_t size) {  // FNV-1a over the ids
  uint64_t hash = 1469598103934665603ull;
  for (size_t k = 0; k < size; ++k) hash = (hash ^ history[k]) * 1099511628211ull;
  return hash;
}
}  // namespace

SharedHiddenCache::SharedHiddenCache(size_t slots, size_t key_size, size_t hidden_size)
    : slots_(slots), key_size_(key_size), hidden_size_(hidden_size), busy_(new std::atomic<bool>[slots]),
      keys_(slots_ * key_size, 0xffffffffu),  // no word has this id: every slot empty
      values_(slots_ * hidden_size) {
  for (size_t i = 0; i < slots_; ++i) busy_[i].store(false, std::memory_order_relaxed);
}

size_t SharedHiddenCache::Slot(const uint32_t* key) const {
  return static_cast<size_t>(HistoryHash(key, key_size_) % slots_);
}

bool SharedHiddenCache::Find(const uint32_t* key, float* h) {
  const size_t slot = Slot(key);
  if (busy_[slot].exchange(true, std::memory_order_acquire)) return false;  // held: a miss, never a wait
  const uint32_t* k = &keys_[slot * key_size_];
  const bool found = std::equal(key, key + key_size_, k);
  if (found) std::memcpy(h, &values_[slot * hidden_size_], hidden_size_ * sizeof(float));
  busy_[slot].store(false, std::memory_order_release);
  return found;
}

void SharedHiddenCache::Store(const uint32_t* key, const float* h) {
  const size_t slot = Slot(key);
  if (busy_[slot].exchange(true, std::memory_order_acquire)) return;  // held: left as it is
  std::copy(key, key + key_size_, &keys_[slot * key_size_]);
  std::memcpy(&values_[slot * hidden_size_], h, hidden_size_ * sizeof(float));
  busy_[slot].store(false, std::memory_order_release);
}

const float* LocalModel::FindHidden(const uint32_t* history, Scratch* s) const {
  const size_t C = row_size() - 1, H = hidden_size();  // the key: the target history and the source window
  if (s->shared) {
    s->h.resize(H);
    const bool found = s->shared->Find(history, &s->h[0]);
    ++(found ? s->hits : s->misses);
    return found ? &s->h[0] : 0;
  }
  if (s->slots == 0) return 0;
  if (s->keys.size() != s->slots * C) {
    s->keys.assign(s->slots * C, 0xffffffffu);  // no word has this id: every slot empty
    s->values.resize(s->slots * H);
  }
  const size_t slot = static_cast<size_t>(HistoryHash(history, C) % s->slots);
  if (std::equal(history, history + C, &s->keys[slot * C])) {
    ++s->hits;
    return &s->values[slot * H];
  }
  ++s->misses;
  return 0;
}

void LocalModel::StoreHidden(const uint32_t* history, const float* h, Scratch* s) const {
  const size_t C = row_size() - 1, H = hidden_size();
  if (s->shared) {
    s->shared->Store(history, h);
  } else if (s->slots) {  // FindHidden has sized the table
    const size_t slot = static_cast<size_t>(HistoryHash(history, C) % s->slots);
    std::copy(history, history + C, &s->keys[slot * C]);
    std::copy(h, h + H, &s->values[slot * H]);
  }
}

namespace {
void CheckRow(const uint32_t* g, size_t C, size_t R, size_t V, size_t Vs) {
  for (size_t k = 0; k < C; ++k)
    if (g[k] >= V) throw std::invalid_argument("cslm::LocalModel::Score: word id beyond the vocabulary");
  for (size_t k = C; k + 1 < R; ++k)
    if (g[k] >= Vs) throw std::invalid_argument("cslm::LocalModel::Score: source word id beyond the source vocabulary");
  if (g[R - 1] >= V) throw std::invalid_argument("cslm::LocalModel::Score: word id beyond the vocabulary");
}
}  // namespace

void LocalModel::Score(const uint32_t* ngrams, size_t count, bool normalized, float* logprobs,
                       Scratch* scratch) const {
  // The histories missing from the cache computed kBatch at a time with kInt8 (HiddenBatch), one at a time
  // with kFloat32 (whose products gain nothing from a batch): a row whose history is cached, or the previous
  // row's, is scored at once; one whose history waits is scored when its batch is computed (its cache lookup
  // counted as a hit).
  const size_t V = words_.size(), Vs = src_words_.size(), C = order_ - 1, R = row_size(), H = hidden_size();
  const size_t batch = precision_ == kInt8 ? kBatch : 1;
  const uint32_t* waiting[kBatch];  // the histories to compute
  size_t n = 0;
  std::vector<std::pair<size_t, size_t> >& rows = scratch->waiting_rows;  // (row, its history in `waiting`)
  rows.clear();
  scratch->batch_h.resize(kBatch * H);
  float log_z = 0;
  const float* h = 0;
  const uint32_t* last = 0;  // the previous row, whose history is cached at h, or waits as `waiting[last_at]`
  size_t last_at = kBatch;
  for (size_t i = 0; i <= count; ++i) {
    if (n == batch || (i == count && n)) {  // compute the waiting histories, cache them, score their rows
      float* out[kBatch];
      float lz[kBatch];
      for (size_t k = 0; k < n; ++k) out[k] = &scratch->batch_h[k * H];
      HiddenBatch(waiting, n, out, scratch);
      for (size_t k = 0; k < n; ++k) {
        StoreHidden(waiting[k], out[k], scratch);
        lz[k] = normalized ? LogNormaliser(out[k], scratch) : 0.0f;
      }
      for (size_t k = 0; k < rows.size(); ++k) {
        const size_t row = rows[k].first, at = rows[k].second;
        logprobs[row] = Activation(out[at], ngrams[row * R + R - 1]) - lz[at];
      }
      n = 0;
      rows.clear();
      last = 0;  // the cache's slots may hold other histories now
    }
    if (i == count) break;
    const uint32_t* g = ngrams + i * R;
    CheckRow(g, C, R, V, Vs);
    if (!last || !std::equal(g, g + R - 1, last)) {
      last = g;
      last_at = kBatch;
      for (size_t k = 0; k < n && last_at == kBatch; ++k)
        if (std::equal(g, g + R - 1, waiting[k])) last_at = k;
      if (last_at < kBatch) {
        if (scratch->shared || scratch->slots) ++scratch->hits;  // computed once, as a cache would have it
      } else if ((h = FindHidden(g, scratch)) != 0) {
        if (normalized) log_z = LogNormaliser(h, scratch);
      } else {
        last_at = n;
        waiting[n++] = g;
      }
    }
    if (last_at < kBatch)
      rows.push_back(std::make_pair(i, last_at));
    else
      logprobs[i] = Activation(h, g[R - 1]) - (normalized ? log_z : 0.0f);
  }
}

}  // namespace cslm
