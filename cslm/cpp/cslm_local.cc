// cslm_local.cc -- see cslm_local.h.
#include "cslm_local.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

// The hot loops are compiled for AVX-512 and AVX2+FMA beside the baseline and
// picked at run time (GCC function multi-versioning), so a binary built for
// any x86-64 uses the vector units the machine has.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__)
#define CSLM_KERNEL __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define CSLM_KERNEL
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

// The number after `"key":` in a JSON text (the first occurrence), or `missing`.
double JsonNumber(const std::string& json, const std::string& key, double missing) {
  const std::string pat = "\"" + key + "\"";
  size_t at = json.find(pat);
  while (at != std::string::npos) {
    size_t p = at + pat.size();
    while (p < json.size() && (json[p] == ' ' || json[p] == '\n' || json[p] == '\t' || json[p] == '\r')) ++p;
    if (p < json.size() && json[p] == ':') {
      ++p;
      const char* start = json.c_str() + p;
      char* end = 0;
      const double v = strtod(start, &end);
      if (end != start) return v;
      return missing;  // null or another type
    }
    at = json.find(pat, at + 1);
  }
  return missing;
}

// One tensor of a safetensors file: dtype, shape, byte range of the data.
struct TensorInfo {
  std::string dtype;
  std::vector<size_t> shape;
  size_t begin, end;
};

// Parses the entry `"name": {"dtype": ..., "shape": [...], "data_offsets": [a, b]}`
// of a safetensors header. Returns false if the name is absent.
bool FindTensor(const std::string& header, const std::string& name, TensorInfo* t, const std::string& file) {
  const size_t at = header.find("\"" + name + "\"");
  if (at == std::string::npos) return false;
  const size_t open = header.find('{', at);
  const size_t close = header.find('}', open);
  if (open == std::string::npos || close == std::string::npos) throw Fail(file, "malformed header at " + name);
  const std::string obj = header.substr(open, close - open + 1);
  const size_t d = obj.find("\"dtype\"");
  if (d == std::string::npos) throw Fail(file, name + " has no dtype");
  const size_t q1 = obj.find('"', obj.find(':', d) + 1);
  const size_t q2 = obj.find('"', q1 + 1);
  t->dtype = obj.substr(q1 + 1, q2 - q1 - 1);
  std::vector<double> nums[2];
  const char* keys[2] = {"\"shape\"", "\"data_offsets\""};
  for (int k = 0; k < 2; ++k) {
    const size_t s = obj.find(keys[k]);
    if (s == std::string::npos) throw Fail(file, name + " has no " + keys[k]);
    size_t p = obj.find('[', s) + 1;
    const size_t e = obj.find(']', p);
    while (p < e) {
      const char* start = obj.c_str() + p;
      char* end = 0;
      const double v = strtod(start, &end);
      if (end == start) {
        ++p;
        continue;
      }
      nums[k].push_back(v);
      p = end - obj.c_str();
    }
  }
  if (nums[1].size() != 2) throw Fail(file, name + ": data_offsets must have two numbers");
  t->shape.assign(nums[0].begin(), nums[0].end());
  t->begin = static_cast<size_t>(nums[1][0]);
  t->end = static_cast<size_t>(nums[1][1]);
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
    header_ = blob_.substr(8, n);
    data_ = 8 + n;
  }
  bool Has(const std::string& name) const {
    TensorInfo t;
    return FindTensor(header_, name, &t, path_);
  }
  // Copies tensor `name` (float32, `dims` dimensions) into out; returns its shape.
  std::vector<size_t> Get(const std::string& name, size_t dims, std::vector<float>* out) const {
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
  std::string path_, blob_, header_;
  size_t data_;
};

// y[0..n) += a * x[0..n)
CSLM_KERNEL void Axpy(size_t n, float a, const float* __restrict x, float* __restrict y) {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// x . y, with 16 independent partial sums so that the compiler vectorises it
// without reassociating (no -ffast-math needed).
CSLM_KERNEL float Dot(size_t n, const float* __restrict x, const float* __restrict y) {
  float acc[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (size_t l = 0; l < 16; ++l) acc[l] += x[i + l] * y[i + l];
  float s = 0;
  for (; i < n; ++i) s += x[i] * y[i];
  for (size_t l = 0; l < 16; ++l) s += acc[l];
  return s;
}

void Relu(size_t n, float* x) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] > 0 ? x[i] : 0;
}

}  // namespace

LocalModel::LocalModel(const std::string& dir) : order_(0), embed_(0), h1_(0), self_norm_(0), bos_(0), eos_(0), unk_(0) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/model.safetensors", voc_path = dir + "/cslm.vocab";
  const std::string cfg = ReadFile(cfg_path);
  if (cfg.find("\"format\": \"cslm\"") == std::string::npos && cfg.find("\"format\":\"cslm\"") == std::string::npos)
    throw Fail(cfg_path, "not a CSLM model directory (format is not \"cslm\")");
  const double order = JsonNumber(cfg, "order", -1);
  self_norm_ = JsonNumber(cfg, "self_norm", 0);
  if (order < 2) throw Fail(cfg_path, "no valid \"order\"");
  order_ = static_cast<unsigned>(order);

  {  // the shortlist: `word<TAB>count` per line, in id order
    std::ifstream in(voc_path.c_str());
    if (!in) throw Fail(voc_path, "cannot read");
    std::string line;
    std::map<std::string, uint32_t> special;
    while (std::getline(in, line)) {
      const std::string w = line.substr(0, line.find('\t'));
      if (w == "<s>" || w == "</s>" || w == "[UNK]") special[w] = static_cast<uint32_t>(words_.size());
      words_.push_back(w);
    }
    if (special.size() != 3) throw Fail(voc_path, "must hold <s>, </s> and [UNK]");
    bos_ = special["<s>"];
    eos_ = special["</s>"];
    unk_ = special["[UNK]"];
  }
  const size_t V = words_.size(), C = order_ - 1;

  SafeTensors st(st_path);
  std::vector<float> embed, w1;
  std::vector<size_t> s = st.Get("embed.weight", 2, &embed);
  if (s[0] != V) {
    std::ostringstream m;
    m << "embed.weight has " << s[0] << " rows but " << voc_path << " has " << V << " words";
    throw Fail(st_path, m.str());
  }
  embed_ = s[1];
  s = st.Get("hidden.0.weight", 2, &w1);
  h1_ = s[0];
  if (s[1] != C * embed_) throw Fail(st_path, "hidden.0.weight does not take order-1 projections (order in config.json?)");
  st.Get("hidden.0.bias", 1, &b1_);

  // T_p[w] = W_1[:, p*E:(p+1)*E] . embed[w]: the first layer's share of history
  // position p, for every word (cslm/model.py `features`, premultiplied).
  table_.assign(C * V * h1_, 0.0f);
  std::vector<float> w1t(embed_ * h1_);  // W_1's block of position p, transposed: [e][j]
  for (size_t p = 0; p < C; ++p) {
    for (size_t j = 0; j < h1_; ++j)
      for (size_t e = 0; e < embed_; ++e) w1t[e * h1_ + j] = w1[j * C * embed_ + p * embed_ + e];
    for (size_t w = 0; w < V; ++w) {
      float* row = &table_[(p * V + w) * h1_];
      const float* x = &embed[w * embed_];
      for (size_t e = 0; e < embed_; ++e) Axpy(h1_, x[e], &w1t[e * h1_], row);
    }
  }

  size_t in = h1_;
  for (size_t k = 1; st.Has("hidden." + std::to_string(k) + ".weight"); ++k) {
    Layer L;
    std::vector<float> w;
    s = st.Get("hidden." + std::to_string(k) + ".weight", 2, &w);
    if (s[1] != in) throw Fail(st_path, "hidden layer sizes do not chain");
    L.in = s[1];
    L.out = s[0];
    L.wt.resize(L.in * L.out);
    for (size_t j = 0; j < L.out; ++j)
      for (size_t i = 0; i < L.in; ++i) L.wt[i * L.out + j] = w[j * L.in + i];
    st.Get("hidden." + std::to_string(k) + ".bias", 1, &L.bias);
    in = L.out;
    layers_.push_back(L);
  }
  s = st.Get("out.weight", 2, &out_w_);
  if (s[0] != V || s[1] != in) throw Fail(st_path, "out.weight does not match the vocabulary and the last hidden layer");
  st.Get("out.bias", 1, &out_b_);
}

void LocalModel::Hidden(const uint32_t* history, float* h, Scratch* scratch) const {
  const size_t V = words_.size();
  std::vector<float>& a = scratch->a;
  a.assign(b1_.begin(), b1_.end());
  for (size_t p = 0; p + 1 < order_; ++p) {  // h_1 = relu(b_1 + sum_p T_p[w_p])
    const float* row = &table_[(p * V + history[p]) * h1_];
    for (size_t j = 0; j < h1_; ++j) a[j] += row[j];
  }
  Relu(h1_, &a[0]);
  std::vector<float>& b = scratch->b;
  for (size_t k = 0; k < layers_.size(); ++k) {  // h_k = relu(W_k h_{k-1} + b_k)
    const Layer& L = layers_[k];
    b.assign(L.bias.begin(), L.bias.end());
    for (size_t i = 0; i < L.in; ++i)
      if (a[i] != 0) Axpy(L.out, a[i], &L.wt[i * L.out], &b[0]);  // rectified zeros cost nothing
    Relu(L.out, &b[0]);
    a.swap(b);
  }
  std::memcpy(h, &a[0], hidden_size() * sizeof(float));
}

float LocalModel::Activation(const float* h, uint32_t word) const {
  const size_t H = hidden_size();
  return Dot(H, &out_w_[word * H], h) + out_b_[word];  // o_w = out_w . h + c_w
}

float LocalModel::LogNormaliser(const float* h, Scratch* scratch) const {
  const size_t V = words_.size();
  std::vector<float>& o = scratch->b;
  o.resize(V);
  float top = -INFINITY;
  for (size_t v = 0; v < V; ++v) {
    o[v] = Activation(h, static_cast<uint32_t>(v));
    top = std::max(top, o[v]);
  }
  double z = 0;
  for (size_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(o[v] - top));
  return top + static_cast<float>(std::log(z));  // ln Z = ln sum_v exp(o_v)
}

void LocalModel::Score(const uint32_t* ngrams, size_t count, bool normalized, float* logprobs,
                       Scratch* scratch) const {
  const size_t V = words_.size(), H = hidden_size();
  std::vector<float> h(H);
  float log_z = 0;
  const uint32_t* last = 0;  // consecutive n-grams often share their history
  for (size_t i = 0; i < count; ++i) {
    const uint32_t* g = ngrams + i * order_;
    for (unsigned k = 0; k < order_; ++k)
      if (g[k] >= V) throw std::invalid_argument("cslm::LocalModel::Score: word id beyond the vocabulary");
    if (!last || !std::equal(g, g + order_ - 1, last)) {
      Hidden(g, &h[0], scratch);
      if (normalized) log_z = LogNormaliser(&h[0], scratch);
      last = g;
    }
    logprobs[i] = Activation(&h[0], g[order_ - 1]) - (normalized ? log_z : 0.0f);
  }
}

}  // namespace cslm
