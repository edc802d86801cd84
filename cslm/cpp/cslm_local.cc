// cslm_local.cc -- see cslm_local.h.
#include "cslm_local.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cslm_json.h"
#include "cslm_kernels.h"
#include "cslm_modeldir.h"

namespace cslm {

static_assert(LocalModel::kBatch <= kKernelRows, "HiddenBatch's histories go to gemv_i8_batch in one call");

namespace {
// FNV-1a over `size` ids: the history caches' and the source cache's slots.
uint64_t IdHash(const uint32_t* ids, size_t size) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t k = 0; k < size; ++k) hash = (hash ^ ids[k]) * 1099511628211ull;
  return hash;
}

// The ids of <s>, </s> and [UNK] in a vocabulary read from `path`; throws naming it if one is missing.
void SpecialIds(const std::vector<std::string>& words, const std::string& path, uint32_t* bos, uint32_t* eos,
                uint32_t* unk) {
  std::map<std::string, uint32_t> special;
  for (size_t i = 0; i < words.size(); ++i)
    if (words[i] == "<s>" || words[i] == "</s>" || words[i] == "[UNK]") special[words[i]] = static_cast<uint32_t>(i);
  if (special.size() != 3) throw FileError(path, "must hold <s>, </s> and [UNK]");
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
    : kernels_(&CpuKernels()), precision_(precision), order_(0), window_(0), embed_(0), h1_(0), self_norm_(0),
      nce_(false), bos_(0), eos_(0), unk_(0), src_bos_(0), src_eos_(0), src_unk_(0) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/model.safetensors", voc_path = dir + "/cslm.vocab",
                    src_voc_path = dir + "/cslm.src.vocab";
  const Json cfg = Json::Parse(ReadFile(cfg_path), cfg_path);
  const Json* format = cfg.Find("format");
  if (!format || !format->is_string() || format->string() != "cslm")
    throw FileError(cfg_path, "not a CSLM model directory (format is not \"cslm\")");
  const Json* model = cfg.Find("model");
  const Json* order = model ? model->Find("order") : 0;
  if (!order || !order->is_number() || order->number() < 2 || order->number() > 64 ||
      order->number() != static_cast<unsigned>(order->number()))
    throw FileError(cfg_path, "no valid \"order\" in \"model\"");
  order_ = static_cast<unsigned>(order->number());
  // A joint model (NNJM): m source words follow the target history in each row; absent or 0 for a plain CSLM.
  const Json* window = model->Find("source_window");
  if (window) {
    const size_t m = WholeNumber(*window, cfg_path, "\"source_window\" in \"model\"");
    if (m > 1024) throw FileError(cfg_path, "\"source_window\" in \"model\" is too large");
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
      throw FileError(src_voc_path, m.str());
    }
  }
  const size_t V = words_.size(), C = order_ - 1, M = window_, Vs = src_words_.size();

  SafeTensors st(st_path);
  Floats embed, src_embed, w1;
  std::vector<size_t> s = st.Get("embed.weight", 2, &embed);
  if (s[0] != V) {
    std::ostringstream m;
    m << "embed.weight has " << s[0] << " rows but " << voc_path << " has " << V << " words";
    throw FileError(st_path, m.str());
  }
  embed_ = s[1];
  if (M) {
    if (!st.Has("src_embed.weight")) throw FileError(st_path, "no tensor src_embed.weight (a joint model's source embedding)");
    s = st.Get("src_embed.weight", 2, &src_embed);
    if (s[0] != Vs || s[1] != embed_) {
      std::ostringstream m;
      m << "src_embed.weight is " << s[0] << " x " << s[1] << " but " << src_voc_path << " has " << Vs
        << " words of projection size " << embed_;
      throw FileError(st_path, m.str());
    }
  }
  s = st.Get("hidden.0.weight", 2, &w1);
  h1_ = s[0];
  if (s[1] != (C + M) * embed_)
    throw FileError(st_path, "hidden.0.weight does not take order-1 (+ source_window) projections (order in config.json?)");
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
      kernels_->gemv(&w1t[0], h1_, &all[0], emb + w * embed_, embed_, &zero[0], &row[0]);
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
    if (s[1] != in) throw FileError(st_path, "hidden layer sizes do not chain");
    L.in = s[1];
    L.out = s[0];
    L.in64 = (L.in + 63) / 64 * 64;
    L.out16 = (L.out + 15) / 16 * 16;
    if (precision_ == kInt8) {
      // W_k[j][i] ~ s_j q_j[i] (cslm_local.h, "Precision"), in groups of four inputs per output. A sum of
      // in x 255 x 127 must fit 32 bits.
      if (L.in > 65536)
        throw FileError(st_path, "hidden layer " + std::to_string(k) + " is too wide for precision int8");
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
  if (s[0] != V || s[1] != in)
    throw FileError(st_path, "out.weight does not match the vocabulary and the last hidden layer");
  st.Get("out.bias", 1, &out_b_);
  out_wt_.resize(out_w_.size());  // transposed, for the whole softmax as one product
  for (size_t v = 0; v < V; ++v)
    for (size_t k = 0; k < in; ++k) out_wt_[k * V + v] = out_w_[v * in + k];
}

const char* LocalModel::Kernels() { return CpuKernels().name; }

void LocalModel::FirstLayer(const uint32_t* history, float* a, Scratch* scratch) const {
  const size_t V = words_.size(), C = order_ - 1;
  const float* source = window_ ? SourceSum(history + C, scratch) : nullptr;
  if (precision_ == kInt8) {  // the tables in bfloat16
    const uint16_t* rows[64];  // order <= 64 (checked at load)
    for (size_t p = 0; p < C; ++p) rows[p] = &table16_[(p * V + history[p]) * h1p_];
    kernels_->sum_relu_bf16(h1p_, rows, C, source, &b1_[0], a);  // a: h1p_ floats, the padding's zero
    return;
  }
  const float* rows[65];  // order <= 64 (checked at load): the history's rows and the source window's sum
  for (size_t p = 0; p < C; ++p) rows[p] = &table_[(p * V + history[p]) * h1_];
  size_t k = C;
  if (source) rows[k++] = source;
  kernels_->sum_relu(h1_, rows, k, &b1_[0], a);  // h_1 = relu(b_1 + sum_p T_p[w_p] + sum_q S_q[s_q])
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
    // rectified zeros cost nothing: the others, packed
    const size_t nnz = kernels_->pack(L.in, &a[0], &idx[0], &val[0]);
    kernels_->gemv(&L.wt[0], L.out, &idx[0], &val[0], nnz, &L.bias[0], &b[0]);
    kernels_->relu(L.out, &b[0]);
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
    for (size_t i = 0; i < n; ++i) sh[i] = kernels_->quantize(L.in, L.in64, a + i * stride, r + i * stride);
    kernels_->gemv_i8_batch(&L.q[0], L.in64 / 4, L.out16, r, acc, stride, n);
    for (size_t i = 0; i < n; ++i)
      kernels_->dequant_relu(L.out, acc + i * stride, sh[i], &L.scale[0], &L.bias[0], b + i * stride);
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
  const uint64_t hash = IdHash(window, window_);
  const size_t slot = static_cast<size_t>((hash ^ (hash >> 29)) % kSourceSlots);
  uint32_t* key = &s->src_keys[slot * window_];
  float* sum = &s->src_values[slot * h1p_];
  if (std::equal(window, window + window_, key)) return sum;
  const size_t Vs = src_words_.size();
  std::fill(sum, sum + h1p_, 0.0f);
  for (size_t q = 0; q < window_; ++q) {
    if (precision_ == kInt8)
      kernels_->add_bf16(h1p_, &src_table16_[(q * Vs + window[q]) * h1p_], sum);
    else
      kernels_->add(h1_, &src_table_[(q * Vs + window[q]) * h1_], sum);
  }
  std::copy(window, window + window_, key);
  return sum;
}

float LocalModel::Activation(const float* h, uint32_t word) const {
  const size_t H = hidden_size();
  return kernels_->dot(H, &out_w_[word * H], h) + out_b_[word];  // o_w = out_w . h + c_w
}

float LocalModel::LogNormaliser(const float* h, Scratch* scratch) const {
  const size_t V = words_.size(), H = hidden_size();
  std::vector<uint32_t>& idx = scratch->idx;
  Floats& val = scratch->a;
  idx.resize(H);
  val.resize(H);
  const size_t nnz = kernels_->pack(H, h, &idx[0], &val[0]);  // the rectified layer's nonzeros, packed
  Floats& o = scratch->b;
  o.resize(V);
  kernels_->gemv(&out_wt_[0], V, &idx[0], &val[0], nnz, &out_b_[0], &o[0]);  // every o_v = out_v . h + c_v
  const float top = *std::max_element(o.begin(), o.end());
  double z = 0;
  for (size_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(o[v] - top));
  return top + static_cast<float>(std::log(z));  // ln Z = ln sum_v exp(o_v)
}

SharedHiddenCache::SharedHiddenCache(size_t slots, size_t key_size, size_t hidden_size)
    : slots_(slots), key_size_(key_size), hidden_size_(hidden_size), busy_(new std::atomic<bool>[slots]),
      keys_(slots_ * key_size, 0xffffffffu),  // no word has this id: every slot empty
      values_(slots_ * hidden_size) {
  for (size_t i = 0; i < slots_; ++i) busy_[i].store(false, std::memory_order_relaxed);
}

size_t SharedHiddenCache::Slot(const uint32_t* key) const {
  return static_cast<size_t>(IdHash(key, key_size_) % slots_);
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
  const size_t slot = static_cast<size_t>(IdHash(history, C) % s->slots);
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
    const size_t slot = static_cast<size_t>(IdHash(history, C) % s->slots);
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
