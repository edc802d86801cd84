// cslm_local.h -- the CSLM evaluated in the caller's process, for decoders on
// CPU cores: no server, no round trip, no dependency beyond C++11.
//
// It reads a model directory written by `cslm train` (config.json,
// model.safetensors in float32, cslm.vocab) and computes the network of
// cslm/model.py for one n-gram w_1 .. w_n (Schwenk 2007; Cho et al. 2014, Sec. 4.1.2):
//
//   h_1 = relu(b_1 + sum_p T_p[w_p])           p = 1 .. n-1: the first layer, premultiplied
//   h_k = relu(W_k h_{k-1} + b_k)              the other rectified layers
//   o_w = out_w . h_last + c_w                 the output activation of the predicted word
//   ln P(w_n | w_1 .. w_{n-1}) = o_w - ln Z,   Z = sum_v exp(o_v)   (Eq. 2's softmax)
//
// T_p[w] = W_1[:, p*E:(p+1)*E] . embed[w] is the first layer's product with word
// w's projection at history position p, computed once at load (as NPLM does):
// a query then costs one lookup-and-add per history word plus the other layers,
// instead of the (n-1)*E x H_1 product. Memory: (n-1) * V * H_1 floats
// (123 MB for the `small` preset, 553 MB for `paper`).
//
// A joint model (NNJM, Devlin et al. 2014; config.json's "source_window" m > 0,
// its source shortlist in cslm.src.vocab) also reads m source words s_1 .. s_m,
// the window centred on the source word the predicted word is affiliated to.
// Its first layer takes them after the target history, each premultiplied the
// same way with the source embedding:
//
//   h_1 = relu(b_1 + sum_p T_p[w_p] + sum_q S_q[s_q])   q = 1 .. m
//   S_q[s] = W_1[:, (n-1+q-1)*E:(n-1+q)*E] . src_embed[s]
//
// and a query row is w_1 .. w_{n-1}, s_1 .. s_m, w_n: row_size() = n + m ids
// (m = 0 for a plain CSLM: the row is the n-gram). Extra memory: m * V_src * H_1 floats.
//
// Two ways to score (Score's `normalized`):
//   * normalized: the exact log-probability, o_w - ln Z over the whole shortlist;
//     what `cslm score` prints. Costs the V x H_last output product per history.
//   * self-normalised: o_w alone, one output row. Exact only for a model trained
//     with the (ln Z)^2 penalty (Devlin et al. 2014; `cslm train --self-norm`),
//     whose ln Z stays near 0; what `cslm score --self-normalized` prints.
//
//   cslm::LocalModel lm("/models/cslm");            // throws std::runtime_error naming the file
//   std::vector<uint32_t> row = {...};                // row_size() ids: history, source window, predicted word
//   float lp;
//   lm.Score(&row[0], 1, lm.self_normalized(), &lp, &scratch);
//
// Precision (the constructor's `precision`):
//   * kFloat32: every layer in float32, as trained.
//   * kInt8: the rectified layers after the first (W_k, k >= 2) in 8 bits, a
//     faster recipe beside the paper's, after Vanhoucke et al. (2011)'s 8-bit
//     networks on CPUs:
//       W_k[j][i] ~ s_j q_j[i],  q an int8 in -127..127,  s_j = max_i |W_k[j][i]| / 127
//     per output unit; the layer's input h (>= 0 after a ReLU), per history,
//       h[i] ~ s_h r[i],  r in 0..255,  s_h = max_i h[i] / 255
//     and then
//       h_k[j] = relu(b_k[j] + s_h s_j sum_i r[i] q_j[i])
//     with the sum exact in 32-bit integers: AMX's tdpbusd or AVX-512 VNNI's
//     vpdpbusd where the CPU has them, AVX2's vpmaddwd (level with
//     kFloat32), or a plain loop (several times slower). Score computes the
//     histories missing from its cache kBatch at a time (HiddenBatch), so
//     that with AMX or VNNI each layer's weights are read once for several;
//     the sums being exact, each history's layers are those it has alone.
//     Its speed against kFloat32's: docs/moses-feature.md.
//     The first layer's premultiplied tables T_p (and a joint model's S_q)
//     are kept in bfloat16, each entry the float32 product rounded to the
//     nearest (ties to even): half their memory and half the bytes a
//     history reads. Units are paired in each 32-bit word, so that one
//     shift or one mask widens each exactly (cslm_kernels.h, PairedIndex).
//     Their sum, its bias and ReLU are float32, and its output is rounded
//     to 8 bits next anyway. The output layer and ln Z stay
//     float32. The scores move by a few thousandths of a nat on average
//     (benchmarks/bench_cslm_precision.py, docs/moses-feature.md).
//
// A LocalModel is read-only after construction: threads share one, each with
// its own Scratch.
#ifndef CSLM_LOCAL_H_
#define CSLM_LOCAL_H_

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <atomic>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace cslm {

struct Kernels;  // cslm_kernels.h

// Storage that starts on a 64-byte cache line. The weights and working
// vectors are kept in it, so that in a layer whose width is a multiple of 16
// floats every row, and every 64-byte vector load of it, lies within a cache
// line: a load that straddles two lines costs two (with std::vector's 16-byte
// alignment every load of the second layer's product did, and the product
// took about a tenth longer).
template <class T>
struct CacheLineAllocator {
  typedef T value_type;
  CacheLineAllocator() {}
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = 0;
    if (n > static_cast<size_t>(-1) / sizeof(T) || posix_memalign(&p, 64, n ? n * sizeof(T) : 64) != 0)
      throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { free(p); }
};
template <class T, class U>
bool operator==(const CacheLineAllocator<T>&, const CacheLineAllocator<U>&) { return true; }
template <class T, class U>
bool operator!=(const CacheLineAllocator<T>&, const CacheLineAllocator<U>&) { return false; }
typedef std::vector<float, CacheLineAllocator<float> > Floats;
typedef std::vector<int8_t, CacheLineAllocator<int8_t> > Int8s;
typedef std::vector<uint8_t, CacheLineAllocator<uint8_t> > Uint8s;
typedef std::vector<uint16_t, CacheLineAllocator<uint16_t> > Bf16s;  // bfloat16s: a float32's top 16 bits
typedef std::vector<int32_t, CacheLineAllocator<int32_t> > Int32s;

// How the rectified layers after the first are stored and computed (above).
enum Precision { kFloat32, kInt8 };
// "fp32" or "int8" to a Precision; false for another name.
bool ParsePrecision(const std::string& name, Precision* precision);

// A cache of last hidden layers by history that several threads share (the
// evaluator threads of cslm_native.cc, which score one server's requests: a
// history one thread computed is then found by every other). Direct-mapped;
// each slot behind a try-lock, so that no thread ever waits for another: a
// slot another thread holds reads as absent, or is left as it is.
class SharedHiddenCache {
 public:
  // `slots` (at least 1) histories of `key_size` ids, each with a layer of `hidden_size` floats.
  SharedHiddenCache(size_t slots, size_t key_size, size_t hidden_size);
  // Copies the layer cached for `key` (key_size ids) into h and returns true;
  // false where it is absent or another thread holds its slot.
  bool Find(const uint32_t* key, float* h);
  // Caches h for `key`, replacing the slot's history (unless another thread holds it).
  void Store(const uint32_t* key, const float* h);

 private:
  size_t Slot(const uint32_t* key) const;
  size_t slots_, key_size_, hidden_size_;
  std::unique_ptr<std::atomic<bool>[]> busy_;  // a slot's lock
  std::vector<uint32_t> keys_;                 // slots x key_size ids; 0xffffffff: empty
  Floats values_;                              // slots x hidden_size
};

class LocalModel {
 public:
  // Per-thread working memory for Score (grown on demand), and a direct-mapped
  // cache of last hidden layers by history: a decoder expands one hypothesis
  // with many phrases, whose first words share the hypothesis' history, so the
  // hidden layers are computed once and each n-gram costs one output row.
  struct Scratch {
    explicit Scratch(size_t history_slots = 4096) : slots(history_slots), hits(0), misses(0), shared(0) {}
    Floats a, b, h, val;
    std::vector<uint32_t> idx;
    size_t slots;                  // 0: no history cache of its own
    std::vector<uint32_t> keys;    // slots x (row_size-1) ids; keys[slot*(row_size-1)] == kEmpty: unused
    Floats values;                 // slots x hidden_size()
    size_t hits, misses;
    SharedHiddenCache* shared;     // if set, the history cache used instead of the scratch's own
    // A joint model's source part of the first layer, sum_q S_q[s_q], by window
    // (direct-mapped, kSourceSlots): a sentence has one window per source
    // position, so each is summed about once a sentence, as Devlin et al.
    // (2014) precompute the source side once per sentence.
    std::vector<uint32_t> src_keys;  // kSourceSlots x source_window() ids
    Floats src_values;               // kSourceSlots x H_1
    // Score's batch of last hidden layers, and its rows waiting for them (row,
    // history in the batch); kInt8: the batch computed together (HiddenBatch),
    // each history's layer input and output, rounded input and sums
    Floats batch_a, batch_b;
    Uint8s batch_r;
    Int32s batch_acc;
    Floats batch_h;
    std::vector<std::pair<size_t, size_t> > waiting_rows;
  };
  static const size_t kSourceSlots = 256;
  // Histories Score computes in one batch (HiddenBatch): with kInt8 together,
  // so that a layer's 8-bit weights are read once for all of them (AMX's tiles
  // hold 16; VNNI's registers, 8 at a time).
  static const size_t kBatch = 16;

  // Loads MODEL_DIR, its layers after the first kept in `precision`; throws
  // std::runtime_error("FILE: reason") on anything missing, malformed or
  // inconsistent (shapes, dtype, vocabulary size).
  explicit LocalModel(const std::string& model_dir, Precision precision = kFloat32);

  Precision precision() const { return precision_; }
  // n: the target n-gram's order (the predicted word and n-1 history words).
  unsigned order() const { return order_; }
  // m: a joint model's source window; 0 for a plain CSLM.
  unsigned source_window() const { return window_; }
  // Ids per query row: order() + source_window().
  unsigned row_size() const { return order_ + window_; }
  size_t vocab_size() const { return words_.size(); }
  const std::vector<std::string>& vocabulary() const { return words_; }
  // A joint model's source shortlist (cslm.src.vocab, its own ids); empty for a plain CSLM.
  const std::vector<std::string>& source_vocabulary() const { return src_words_; }
  uint32_t bos_id() const { return bos_; }
  uint32_t eos_id() const { return eos_; }
  uint32_t unk_id() const { return unk_; }
  // A joint model's <s>, </s> and [UNK] in its source shortlist (0 for a plain CSLM).
  uint32_t source_bos_id() const { return src_bos_; }
  uint32_t source_eos_id() const { return src_eos_; }
  uint32_t source_unk_id() const { return src_unk_; }
  // True if the model was trained to be self-normalised: with a (ln Z)^2
  // penalty (config.json's meta.train_config.self_norm > 0) or by
  // noise-contrastive estimation (meta.train_config.objective "nce").
  bool self_normalized() const { return self_norm_ > 0 || nce_; }
  double self_norm_alpha() const { return self_norm_; }
  // The first layer's premultiplied tables' memory (float32, or bfloat16 with kInt8).
  size_t table_bytes() const {
    return (table_.size() + src_table_.size()) * sizeof(float) +
           (table16_.size() + src_table16_.size()) * sizeof(uint16_t);
  }
  // The vector instructions the kernels use here: "amx" (AVX-512, with kInt8's products in AMX tiles),
  // "avx512", "avx2" or "baseline" (the CPU's widest, at most what the environment's CSLM_KERNELS names).
  // Throws std::invalid_argument on another CSLM_KERNELS value.
  static const char* Kernels();

  // Scores `count` rows of row_size() ids each (the order()-1 history words
  // oldest first, a joint model's source_window() source words, the predicted
  // word last) into logprobs[0..count): o_w - ln Z if `normalized`, else o_w.
  // Target ids must be < vocab_size(), source ids < source_vocabulary().size()
  // (checked: std::invalid_argument).
  void Score(const uint32_t* ngrams, size_t count, bool normalized, float* logprobs, Scratch* scratch) const;

  // The last hidden layer for one history, a row's first row_size()-1 ids (the
  // target history, then the source window), into h (hidden_size() floats).
  void Hidden(const uint32_t* history, float* h, Scratch* scratch) const;
  size_t hidden_size() const { return layers_.empty() ? h1_ : layers_.back().out; }

  // A joint model's sum_q S_q[s_q] for a window of source_window() ids, through
  // the scratch's source cache (slots of h1p_ floats): a pointer valid until the next call.
  const float* SourceSum(const uint32_t* window, Scratch* scratch) const;

  // o_w and ln Z for a last hidden layer h.
  float Activation(const float* h, uint32_t word) const;
  float LogNormaliser(const float* h, Scratch* scratch) const;

 private:
  // h_1 = relu(b_1 + sum_p T_p[w_p] (+ sum_q S_q[s_q])) of a history into a (H_1 floats; with kInt8, h1p_,
  // the padding's zero).
  void FirstLayer(const uint32_t* history, float* a, Scratch* scratch) const;
  // The last hidden layers of n <= kBatch histories, into h[0..n): Hidden's
  // values. With kInt8, computed together (one pass over each layer's weights
  // with AMX or AVX-512 VNNI: their integer sums are exact, so the values are
  // those of a batch of one, which Hidden is); with kFloat32, one by one.
  void HiddenBatch(const uint32_t* const* histories, size_t n, float* const* h, Scratch* scratch) const;
  // The cached layer of a history (a hit), valid until the next call with this
  // scratch, or null (a miss; null without counting where there is no cache).
  const float* FindHidden(const uint32_t* history, Scratch* scratch) const;
  // Caches h as the history's layer (in the scratch's cache, or its shared one).
  void StoreHidden(const uint32_t* history, const float* h, Scratch* scratch) const;

  struct Layer {
    size_t in, out;
    Floats wt;  // kFloat32: the transposed weight, wt[k * out + j] = W[j][k]
    Floats bias;
    // kInt8: q[(g * out16 + j) * 4 + t] = q_j[4g + t], in and out padded with
    // zeros to in64 (a multiple of 64, AMX's tile row) and out16 (of 16); scale[j] = s_j.
    size_t in64, out16;
    Int8s q;
    Floats scale;
  };

  const cslm::Kernels* kernels_;  // the CPU's kernel set, picked once (cslm_kernels.h)
  Precision precision_;
  unsigned order_, window_;
  size_t embed_, h1_;
  size_t h1p_;  // H_1 padded to a multiple of 32: kInt8's table rows (paired bfloat16) and sums
  double self_norm_;
  bool nce_;
  std::vector<std::string> words_;
  uint32_t bos_, eos_, unk_;
  Floats table_;  // T[p][w][j], (order-1) x V x H_1 (kFloat32)
  Bf16s table16_;  // the same in bfloat16 (kInt8)
  std::vector<std::string> src_words_;
  uint32_t src_bos_, src_eos_, src_unk_;
  Floats src_table_;  // S[q][s][j], source_window x V_src x H_1 (kFloat32)
  Bf16s src_table16_;  // the same in bfloat16 (kInt8)
  Floats b1_;  // b_1; with kInt8 padded with zeros to h1p_
  std::vector<Layer> layers_;  // the rectified layers after the first
  Floats out_w_;   // V x H_last, row per word
  Floats out_wt_;  // the same transposed, H_last x V
  Floats out_b_;   // V
};

}  // namespace cslm

#endif  // CSLM_LOCAL_H_
