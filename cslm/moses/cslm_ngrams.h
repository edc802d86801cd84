// cslm_ngrams.h -- the Moses-independent part of the CSLM feature function:
// which n-grams a phrase-based decoder must score, and a bounded n-gram cache.
//
// Word ids are the server's (cslm::Client). An n-gram is `order` ids, oldest
// first, the predicted word last, left-padded with <s> where the history is
// shorter (the server pads the same way, so padding changes nothing).
//
// For a target phrase w[0..m) and order n:
//   * internal n-grams: the words at index >= n-1 have their whole history
//     inside the phrase, so their scores do not depend on the hypothesis;
//     they are scored once per phrase (in bulk per translation-option list);
//   * boundary n-grams: the first min(m, n-1) words need the previous
//     hypothesis' last n-1 words (the state); plus </s> when the hypothesis
//     completes the sentence. Scored per hypothesis, through the cache.
//   * the state after the phrase is the last n-1 words of (state + phrase):
//     with an n-gram model this gives exact recombination.
#ifndef CSLM_MOSES_NGRAMS_H_
#define CSLM_MOSES_NGRAMS_H_

#include <stddef.h>
#include <stdint.h>

#include <string>
#include <vector>

#include <unordered_map>

namespace cslm {

// Appends one n-gram of `order` ids to `out`: the last order-1 ids of
// hist[0..hist_len) (left-padded with bos), then `word`.
inline void append_ngram(const uint32_t* hist, size_t hist_len, uint32_t word, unsigned order, uint32_t bos,
                         std::vector<uint32_t>* out) {
  const size_t h = order - 1;
  for (size_t i = 0; i < h; ++i) {
    // position i of the history window, counted from its oldest slot
    const size_t need = h - i;  // this slot is `need` words before `word`
    out->push_back(need <= hist_len ? hist[hist_len - need] : bos);
  }
  out->push_back(word);
}

// Internal n-grams of a phrase: one per word at index >= order-1.
inline size_t internal_ngrams(const std::vector<uint32_t>& phrase, unsigned order, uint32_t bos,
                              std::vector<uint32_t>* out) {
  size_t count = 0;
  for (size_t k = order - 1; k < phrase.size(); ++k, ++count) append_ngram(&phrase[0], k, phrase[k], order, bos, out);
  return count;
}

// Boundary n-grams of a phrase applied after `state` (at most order-1 ids, the
// sentence start being <s>), plus the </s> n-gram if `complete`. Writes the new
// state to `next_state`. Returns the number of n-grams appended.
inline size_t boundary_ngrams(const std::vector<uint32_t>& state, const std::vector<uint32_t>& phrase, bool complete,
                              unsigned order, uint32_t bos, uint32_t eos, std::vector<uint32_t>* out,
                              std::vector<uint32_t>* next_state) {
  std::vector<uint32_t> seq(state);
  seq.insert(seq.end(), phrase.begin(), phrase.end());
  const size_t first = state.size();
  const size_t boundary = phrase.size() < order - 1 ? phrase.size() : order - 1;
  size_t count = 0;
  for (size_t k = 0; k < boundary; ++k, ++count) append_ngram(&seq[0], first + k, seq[first + k], order, bos, out);
  if (complete) {
    append_ngram(seq.empty() ? 0 : &seq[0], seq.size(), eos, order, bos, out);
    ++count;
  }
  const size_t keep = seq.size() < order - 1 ? seq.size() : order - 1;
  next_state->assign(seq.end() - keep, seq.end());
  return count;
}

// A bounded map from n-gram to (log-probability, flags). When it holds
// `capacity` entries it is emptied: simple, and cheap enough for one
// decoder thread (the hot n-grams come back within a sentence).
class NgramCache {
 public:
  explicit NgramCache(size_t capacity = 1000000) : capacity_(capacity), hits_(0), misses_(0) {}

  static std::string key(const uint32_t* ids, unsigned order) {
    return std::string(reinterpret_cast<const char*>(ids), order * sizeof(uint32_t));
  }
  bool find(const uint32_t* ids, unsigned order, float* logprob, uint8_t* flags) {
    std::unordered_map<std::string, Entry>::const_iterator it = map_.find(key(ids, order));
    if (it == map_.end()) {
      ++misses_;
      return false;
    }
    ++hits_;
    *logprob = it->second.logprob;
    *flags = it->second.flags;
    return true;
  }
  void insert(const uint32_t* ids, unsigned order, float logprob, uint8_t flags) {
    if (capacity_ == 0) return;
    if (map_.size() >= capacity_) map_.clear();
    Entry e;
    e.logprob = logprob;
    e.flags = flags;
    map_[key(ids, order)] = e;
  }
  // Empties the cache if `n` more entries would not fit, so that the next n
  // inserts all stay.
  void make_room(size_t n) {
    if (map_.size() + n > capacity_) map_.clear();
  }
  size_t size() const { return map_.size(); }
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }

 private:
  struct Entry {
    float logprob;
    uint8_t flags;
  };
  size_t capacity_;
  size_t hits_, misses_;
  std::unordered_map<std::string, Entry> map_;
};

}  // namespace cslm

#endif  // CSLM_MOSES_NGRAMS_H_
