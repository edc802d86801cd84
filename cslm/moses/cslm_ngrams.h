// cslm_ngrams.h -- the Moses-independent part of the CSLM feature function:
// which n-grams a phrase-based decoder must score, a bounded n-gram cache, and
// the checks of the numbers its moses.ini line gives.
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
//   * estimate n-grams: the same first words with only the phrase's history
//     (<s>-padded), for the future-cost estimate; never part of a final score;
//   * the state after the phrase is the last n-1 words of (state + phrase):
//     with an n-gram model this gives exact recombination.
#ifndef CSLM_MOSES_NGRAMS_H_
#define CSLM_MOSES_NGRAMS_H_

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include <algorithm>
#include <cmath>
#include <queue>
#include <type_traits>
#include <utility>

namespace cslm {

// A moses.ini value as a number within [lo, hi]: for an integer type base-10
// digits (a minus sign only for a signed type), for a floating type strtod's
// syntax and finite; nothing before or after. False for anything else, where
// Moses's Scan reads "abc" as 0 and "-5" as a huge unsigned count.
template <class T>
bool parse_number(const std::string& text, T lo, T hi, T* out) {
  if (text.empty() || !(text[0] == '-' || text[0] == '+' || text[0] == '.' || (text[0] >= '0' && text[0] <= '9')))
    return false;
  const char* begin = text.c_str();
  char* end = 0;
  errno = 0;
  long double value;
  if (std::is_integral<T>::value) {
    if (text[0] == '-' && !std::is_signed<T>::value) return false;
    value = std::is_signed<T>::value ? static_cast<long double>(strtoll(begin, &end, 10))
                                     : static_cast<long double>(strtoull(begin, &end, 10));
  } else {
    value = strtold(begin, &end);
    if (!std::isfinite(value)) return false;
  }
  if (errno || end != begin + text.size() || value < lo || value > hi) return false;
  *out = static_cast<T>(value);
  return true;
}

// Appends one n-gram of `order` ids to `out`: the order-1 words of a
// sequence before its position `at` (seq(i): its word i; left-padded with
// bos where fewer precede), then `word`.
template <class Seq>
inline void append_window(const Seq& seq, size_t at, uint32_t word, unsigned order, uint32_t bos,
                          std::vector<uint32_t>* out) {
  const size_t h = order - 1;
  for (size_t i = 0; i < h; ++i) {
    // position i of the history window, counted from its oldest slot
    const size_t need = h - i;  // this slot is `need` words before `word`
    out->push_back(need <= at ? seq(at - need) : bos);
  }
  out->push_back(word);
}

// Appends one n-gram of `order` ids to `out`: the last order-1 ids of
// hist[0..hist_len) (left-padded with bos), then `word`.
inline void append_ngram(const uint32_t* hist, size_t hist_len, uint32_t word, unsigned order, uint32_t bos,
                         std::vector<uint32_t>* out) {
  append_window([hist](size_t i) { return hist[i]; }, hist_len, word, order, bos, out);
}

// Internal n-grams of a phrase: one per word at index >= order-1.
inline size_t internal_ngrams(const std::vector<uint32_t>& phrase, unsigned order, uint32_t bos,
                              std::vector<uint32_t>* out) {
  size_t count = 0;
  for (size_t k = order - 1; k < phrase.size(); ++k, ++count) append_ngram(&phrase[0], k, phrase[k], order, bos, out);
  return count;
}

// Estimate n-grams of a phrase, for the future cost (CSLM::EvaluateInIsolation):
// its first min(m, order-1) words with the history the phrase gives them,
// left-padded with <s>. A fixed-window network has no lower-order model to
// back off to; <s> is the padding it was trained with at the sentence start.
// Only the search's estimate uses them: the boundary n-grams replace them.
inline size_t estimate_ngrams(const std::vector<uint32_t>& phrase, unsigned order, uint32_t bos,
                              std::vector<uint32_t>* out) {
  const size_t first = phrase.size() < order - 1 ? phrase.size() : order - 1;
  for (size_t k = 0; k < first; ++k) append_ngram(&phrase[0], k, phrase[k], order, bos, out);
  return first;
}

// Boundary n-grams of a phrase applied after the state state[0..state_size)
// (at most order-1 ids, the sentence start being <s>), plus the </s> n-gram if
// `complete`. Writes the new state to `next_state` (not the state itself).
// Returns the number of n-grams appended. State and phrase are read in place
// as one sequence, with no allocation: a decoder calls this for every
// hypothesis and every expansion it asks for ahead.
inline size_t boundary_ngrams(const uint32_t* state, size_t state_size, const std::vector<uint32_t>& phrase,
                              bool complete, unsigned order, uint32_t bos, uint32_t eos, std::vector<uint32_t>* out,
                              std::vector<uint32_t>* next_state) {
  const size_t total = state_size + phrase.size(), h = order - 1;
  const auto seq = [&](size_t i) { return i < state_size ? state[i] : phrase[i - state_size]; };  // state + phrase
  const size_t boundary = phrase.size() < h ? phrase.size() : h;
  for (size_t k = 0; k < boundary; ++k) append_window(seq, state_size + k, phrase[k], order, bos, out);
  if (complete) append_window(seq, total, eos, order, bos, out);
  const size_t keep = total < h ? total : h;
  next_state->resize(keep);
  for (size_t i = 0; i < keep; ++i) (*next_state)[i] = seq(total - keep + i);
  return boundary + (complete ? 1 : 0);
}

// Cube pruning's likely next expansions (CSLMBuffer.h): the cells (x+i, y+j)
// of an nx-by-ny cube with i, j >= 0 and (i+1)(j+1) <= corner, row by row.
// A cube is explored from its best corner outwards, best first along both
// axes, so the cells it reaches soonest lie under this hyperbola. (x, y)
// itself comes first; corner 0 gives nothing.
inline void cube_corner(size_t x, size_t y, size_t nx, size_t ny, size_t corner,
                        std::vector<std::pair<size_t, size_t> >* out) {
  out->clear();
  for (size_t i = 0; x + i < nx && i + 1 <= corner; ++i)
    for (size_t j = 0; y + j < ny && (i + 1) * (j + 1) <= corner; ++j) out->push_back(std::make_pair(x + i, y + j));
}

// Cube pruning run ahead (CSLMBuffer.h, predict=). Cube pruning creates
// every cube's (0, 0), then pops the best created cell of the stack `pops`
// times (its pop limit), and each pop creates the popped cell's successors
// (x+1, y) and (x, y+1) once (moses/SearchCubePruning.cpp, BitmapContainer.cpp).
// cube_run does the same for cubes of sizes[c] = (nx, ny), with
// score(c, x, y) for a created cell's score (called once per cell, in the
// order created), and puts every cell it creates in `out`, in that order.
struct CubeCell {
  size_t cube, x, y;
};

// A cell's (cube, x, y) packed into one key (the run ahead's scores kept between rounds).
inline uint64_t cell_key(size_t cube, size_t x, size_t y) {
  return (static_cast<uint64_t>(cube) << 40) ^ (static_cast<uint64_t>(x) << 20) ^ y;
}

template <class Score>
void cube_run(const std::vector<std::pair<size_t, size_t> >& sizes, size_t pops, Score& score,
              std::vector<CubeCell>* out) {
  typedef std::pair<float, size_t> Entry;  // (score, index into out): a created cell awaiting its pop
  std::priority_queue<Entry> best;
  // cube pruning's seen set: one bit per cell, cube c's cell (x, y) at first[c] + x * ny + y
  std::vector<size_t> first(sizes.size() + 1, 0);
  for (size_t c = 0; c < sizes.size(); ++c) first[c + 1] = first[c] + sizes[c].first * sizes[c].second;
  std::vector<uint64_t> created((first.back() + 63) / 64, 0);
  out->clear();
  for (size_t c = 0; c < sizes.size(); ++c) {
    if (sizes[c].first == 0 || sizes[c].second == 0) continue;
    CubeCell cell = {c, 0, 0};
    best.push(Entry(score(c, 0, 0), out->size()));
    out->push_back(cell);
  }
  for (size_t pop = 0; pop < pops && !best.empty(); ++pop) {
    const CubeCell at = (*out)[best.top().second];
    best.pop();
    for (int k = 0; k < 2; ++k) {
      CubeCell next = {at.cube, at.x + (k == 0), at.y + (k == 1)};
      if (next.x >= sizes[at.cube].first || next.y >= sizes[at.cube].second) continue;
      const size_t bit = first[next.cube] + next.x * sizes[next.cube].second + next.y;
      if (created[bit / 64] >> (bit % 64) & 1) continue;  // a cell is created once
      created[bit / 64] |= uint64_t(1) << (bit % 64);
      best.push(Entry(score(next.cube, next.x, next.y), out->size()));
      out->push_back(next);
    }
  }
}

// The run ahead on estimated scores (run-ahead=estimate): one CubeEstimate
// per cube (BackwardsEdge) of the stack about to be searched: `rows` the
// predecessors' scores (plus, from CSLMBuffer, the distortion cost of the
// cube's span after each) and `cols` the options' future scores, each in the
// order the cube sorts them, and `offset` the future-cost estimate of the
// cube's coverage; a cell's score is rows[x] + cols[y] + offset. The real
// score adds the stateful features' boundary costs (the LMs' among them).
struct CubeEstimate {
  const float* rows;
  size_t nx;
  const float* cols;
  size_t ny;
  float offset;
};

struct EstimatedScore {
  explicit EstimatedScore(const std::vector<CubeEstimate>& c) : cubes(c) {}
  float operator()(size_t c, size_t x, size_t y) const { return cubes[c].rows[x] + cubes[c].cols[y] + cubes[c].offset; }
  const std::vector<CubeEstimate>& cubes;
};

inline void cube_pops(const std::vector<CubeEstimate>& cubes, size_t pops, std::vector<CubeCell>* out) {
  std::vector<std::pair<size_t, size_t> > sizes(cubes.size());
  for (size_t c = 0; c < cubes.size(); ++c) sizes[c] = std::make_pair(cubes[c].nx, cubes[c].ny);
  EstimatedScore score(cubes);
  cube_run(sizes, pops, score, out);
}

// The run ahead's provisional value for an n-gram it has no score for yet
// (CSLM::RunAheadSum): the mean log-probability of the answered n-grams that
// end in the same words, shrunk towards the shorter ending's. With m_k the
// mean over the answered n-grams ending in the last k words (k = 0: all of
// them) and c_k their count, the estimate is e_0 = m_0 and, while an ending
// of k words has been answered, e_k = (c_k m_k + e_{k-1}) / (c_k + 1) (one
// pseudo-count of the shorter ending's estimate), up to `levels` words (the
// predicted word and up to levels-1 of its history). A word the search keeps
// proposing after the same words thus scores near what those did, where one
// mean over everything lets the run ahead pop other cells than the search.
// Only the order of the run ahead's cells depends on it, never a score.
// Endings are kept in a direct-mapped table of 2^bits slots: an ending that
// hashes to an occupied slot replaces it, so memory stays fixed (24 bytes a
// slot: 3 MB a decoder thread with the defaults).
class SuffixMeans {
 public:
  explicit SuffixMeans(unsigned levels = 3, unsigned bits = 17)
      : levels_(levels), mask_((size_t(1) << bits) - 1), sum_(0.0), count_(0) {}

  // Adds an answered n-gram (`order` ids, the predicted word last) and its log-probability.
  void add(const uint32_t* ngram, unsigned order, float logprob) {
    if (slots_.empty()) slots_.resize(mask_ + 1);  // at the first answer: a decoder without the buffer has none
    sum_ += logprob;
    ++count_;
    uint64_t h = kSeed;
    for (unsigned k = 1; k <= levels_ && k <= order; ++k) {
      h = step(h, ngram[order - k]);
      Slot& s = slots_[(h >> 1) & mask_];
      if (s.key != h) s = Slot(h);
      s.sum += logprob;
      ++s.count;
    }
  }
  // The provisional log-probability of an n-gram (`fallback` before any answer).
  float estimate(const uint32_t* ngram, unsigned order, float fallback) const {
    if (!count_) return fallback;
    double e = sum_ / count_;
    uint64_t h = kSeed;
    for (unsigned k = 1; k <= levels_ && k <= order; ++k) {
      h = step(h, ngram[order - k]);
      const Slot& s = slots_[(h >> 1) & mask_];
      if (s.key != h) break;  // not answered (or replaced): the shorter ending's estimate stands
      e = (s.sum + e) / (s.count + 1);
    }
    return static_cast<float>(e);
  }
  size_t answered() const { return count_; }

 private:
  static const uint64_t kSeed = 1469598103934665603ull;
  // The key of an ending one word longer (FNV-1a step, then a mix; 0 is never a key).
  static uint64_t step(uint64_t h, uint32_t id) {
    h = (h ^ id) * 1099511628211ull;
    return (h ^ (h >> 31)) | 1;
  }
  struct Slot {
    explicit Slot(uint64_t k = 0) : key(k), sum(0.0), count(0) {}
    uint64_t key;
    double sum;
    uint32_t count;
  };
  unsigned levels_;
  size_t mask_;
  std::vector<Slot> slots_;
  double sum_;
  size_t count_;
};

// The n-gram cache's size per decoder thread when moses.ini gives no
// cache-size= (CSLMOptions::CacheSize): 4,096 where the model is evaluated in
// process, self-normalised, with a history cache and no buffer, since a hit
// there saves one output row's dot product, less than a lookup in a large
// table costs once it misses the processor's caches; else 1,000,000, since a
// hit saves a round trip to a server or a softmax, and the buffer keeps a
// stack's answers in the cache (docs/moses-feature.md, "Measured").
inline size_t default_cache_size(bool in_process, bool self_normalized, size_t history_cache, size_t buffer) {
  return in_process && self_normalized && history_cache > 0 && buffer == 0 ? 4096 : 1000000;
}

// A bounded map from n-gram to (log-probability, flags). When it holds
// `capacity` entries it is emptied: simple, and cheap enough for one
// decoder thread (the hot n-grams come back within a sentence).
// Open addressing (linear probing, at most half full) over one flat array of
// 16-byte slots, four to a cache line: a lookup hashes the ids and reads one
// slot in place, with no allocation. A slot keeps a 64-bit hash of the
// n-gram (its order and ids), not the ids, as KenLM's probing tables do: two
// n-grams in the cache at once share a hash with a probability of about
// n^2 / 2^65 (3e-10 for 100,000). A slot is in use when its tag holds the
// table's current generation (tag = generation << 9 | pending << 8 | flags),
// so emptying the table is a new generation, not a pass over it. The table
// starts small and doubles as it fills, up to the size `capacity` needs.
// An entry may be pending: asked for and not yet answered (the decoder's
// buffer, mark); find() does not see it, and insert() answers it.
class NgramCache {
 public:
  explicit NgramCache(size_t capacity = 1000000)
      : capacity_(capacity), mask_(0), size_(0), generation_(1), hits_(0), misses_(0) {}

  // True, with its value and flags, if the n-gram is in the cache and answered.
  bool find(const uint32_t* ids, unsigned order, float* logprob, uint8_t* flags) {
    if (size_ != 0) {
      const uint64_t key = hash(ids, order);
      for (size_t i = key & mask_;; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (!live(s)) break;  // an empty slot ends the probe
        if (s.key == key) {
          if (s.tag & kPendingBit) break;
          answer(s, logprob, flags);
          return true;
        }
      }
    }
    ++misses_;
    return false;
  }
  // find(), and an n-gram it lacks becomes pending: kAnswered (value and flags
  // set), kPending (marked before), or kMarked (marked now: the caller asks for
  // it; always so when the capacity is 0).
  enum Mark { kAnswered, kPending, kMarked };
  Mark mark(const uint32_t* ids, unsigned order, float* logprob, uint8_t* flags) {
    if (capacity_ == 0) {
      ++misses_;
      return kMarked;
    }
    const uint64_t key = hash(ids, order);
    Slot& s = reserve(key);
    if (live(s)) {
      if (s.tag & kPendingBit) {
        ++misses_;
        return kPending;
      }
      answer(s, logprob, flags);
      return kAnswered;
    }
    ++misses_;
    s.key = key;
    s.value = 0.0f;
    s.tag = generation_ << 9 | kPendingBit;
    ++size_;
    return kMarked;
  }
  // Sets the n-gram's value (answering it if pending); returns true if it was
  // not in the cache.
  bool insert(const uint32_t* ids, unsigned order, float logprob, uint8_t flags) {
    if (capacity_ == 0) return true;
    const uint64_t key = hash(ids, order);
    Slot& s = reserve(key);
    const bool added = !live(s);
    if (added) ++size_;
    s.key = key;
    s.value = logprob;
    s.tag = generation_ << 9 | flags;
    return added;
  }
  // Empties the cache if `n` more entries would not fit, so that the next n
  // inserts all stay.
  void make_room(size_t n) {
    if (size_ + n > capacity_) clear();
  }
  void clear() {
    if (!size_) return;
    size_ = 0;
    if (++generation_ < kGenerations) return;
    generation_ = 1;  // every tag may hold an old generation: mark every slot free
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].tag = 0;
  }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }

 private:
  struct Slot {
    uint64_t key;  // hash(ids, order)
    float value;
    uint32_t tag;  // generation << 9 | pending << 8 | flags
  };
  static const size_t kFirstSlots = 4096;
  static const uint32_t kPendingBit = 1u << 8;
  static const uint32_t kGenerations = 1u << 23;  // a tag's generation has 23 bits; 0 is never current

  // The n-gram's 64-bit hash: each id mixed in by a multiply and a shift,
  // both invertible (so n-grams that differ in one id differ in hash), then
  // splitmix64's finaliser, whose low bits index the table.
  static uint64_t hash(const uint32_t* ids, unsigned order) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ order;
    for (unsigned i = 0; i < order; ++i) {
      h = (h ^ ids[i]) * 0xff51afd7ed558ccdull;
      h ^= h >> 32;
    }
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  }
  // Whether a slot holds an entry (its tag is of the current generation).
  bool live(const Slot& s) const { return (s.tag >> 9) == generation_; }
  // A hit: the answered entry's value and flags.
  void answer(const Slot& s, float* logprob, uint8_t* flags) {
    ++hits_;
    *logprob = s.value;
    *flags = static_cast<uint8_t>(s.tag & 0xff);
  }
  // The table's largest size: a power of two, at least twice the capacity.
  size_t max_slots() const {
    size_t slots = 2;
    while (slots < 2 * capacity_) slots <<= 1;
    return slots;
  }
  // The slot holding `key`, or the empty slot where it goes.
  Slot& probe(uint64_t key) {
    for (size_t i = key & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (!live(s) || s.key == key) return s;
    }
  }
  // probe(), with room made first for one more entry (the table allocated,
  // emptied when full, grown when half full).
  Slot& reserve(uint64_t key) {
    if (slots_.empty()) allocate(std::min(kFirstSlots, max_slots()));
    if (size_ >= capacity_) clear();
    if (2 * (size_ + 1) > slots_.size()) grow();
    return probe(key);
  }
  void allocate(size_t slots) {
    Slot empty = {0, 0.0f, 0};
    slots_.assign(slots, empty);
    mask_ = slots - 1;
    size_ = 0;
    generation_ = 1;
  }
  // Doubles the table (at most half full), unless it is as large as the
  // capacity needs; the entries move to the new one.
  void grow() {
    if (slots_.size() >= max_slots()) return;
    std::vector<Slot> old;
    old.swap(slots_);
    const uint32_t generation = generation_;
    allocate(2 * old.size());
    for (size_t i = 0; i < old.size(); ++i) {
      if ((old[i].tag >> 9) != generation) continue;
      Slot& t = probe(old[i].key);
      t = old[i];
      t.tag = generation_ << 9 | (old[i].tag & 0x1ff);
      ++size_;
    }
  }

  size_t capacity_;
  size_t mask_, size_;
  uint32_t generation_;
  size_t hits_, misses_;
  std::vector<Slot> slots_;
};

}  // namespace cslm

#endif  // CSLM_MOSES_NGRAMS_H_
