// CSLMShared.h -- what the CSLM and NNJM feature functions (CSLM.h, NNJM.h)
// share: the options both read from their moses.ini line, Moses words mapped to
// a model's ids once, scoring through the per-thread cache, and stopping the
// decoder from a decoder thread.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include <boost/unordered_map.hpp>

#include "cslm_backend.h"
#include "cslm_ngrams.h"
#include "moses/TypeDef.h"
#include "util/exception.hh"

namespace Moses {

class Factor;
class FeatureFunction;
class Phrase;
class ScoreComponentCollection;

// The keys both lines take (docs/moses-feature.md, "moses.ini").
struct CSLMOptions {
  CSLMOptions()
      : order(0), self_norm(-1), history_cache(16384), cache_size(kCacheSizeAuto), floor(-100.0f), future_cost(-1),
        stats(false), factor(0), precision(cslm::kFloat32) {}
  // Reads `key` if it is one of these options and returns true; false for another key. A bad
  // value throws, naming the feature (`who`).
  bool Set(const std::string& who, const std::string& key, const std::string& value);
  // The n-gram cache's size: cache-size= if given, else cslm::default_cache_size's (cslm_ngrams.h).
  size_t CacheSize(bool in_process, bool self_normalized, size_t buffer) const;

  static const size_t kCacheSizeAuto = static_cast<size_t>(-1);  // cache-size= not given

  std::string path;      // path=: the model directory
  unsigned order;        // order=: the model's n if given (0: not given)
  int self_norm;         // self-normalized=: 1 o_w alone, 0 the softmax, -1 (auto) as the model was trained
  size_t history_cache;  // history-cache=: hidden layers cached per thread (slots)
  size_t cache_size;     // cache-size=: scores cached per thread (kCacheSizeAuto: CacheSize decides)
  float floor;           // floor=: lowest log-probability passed to the decoder
  int future_cost;       // future-cost=: 1 true, 0 false, -1 not given
  bool stats;            // stats=: one line per sentence on stderr
  FactorType factor;     // factor=: the target factor scored
  cslm::Precision precision;  // precision=: in process, the layers after the first in fp32 or int8
};

// The value of moses.ini key `key` as a number within [lo, hi] (cslm::parse_number); else throws naming
// the feature (`who`), the key, the value and the range.
template <class T>
T ScanNumber(const std::string& who, const std::string& key, const std::string& value, T lo, T hi) {
  T out = lo;
  UTIL_THROW_IF2(!cslm::parse_number(value, lo, hi, &out),
                 who << ": " << key << "=" << value << " is not a number within " << lo << ".." << hi);
  return out;
}

// Says why on stderr, prefixed by the feature's name, and stops the whole
// process now (called from a decoder thread, where an exception would not
// reach the user).
void CSLMFatal(const std::string& who, const std::string& message);

// One thread's map from Moses words to a model's ids, each word looked up in the
// vocabulary once: a flat vector indexed by the factor's id in Moses's
// FactorCollection, as moses/LM/Ken.cpp maps words for KenLM, grown as new
// factors (words of the input that no table holds) come.
class FactorIds {
 public:
  FactorIds(const boost::unordered_map<std::string, uint32_t>& vocab, uint32_t unk) : vocab_(vocab), unk_(unk) {}
  // The id of a factor (unk for a word outside the vocabulary, or no factor).
  uint32_t Id(const Factor* factor);
  // The ids of `phrase`'s words' `factor_type` factors into `ids` (cleared first).
  void Phrase(const Moses::Phrase& phrase, FactorType factor_type, std::vector<uint32_t>* ids);

 private:
  const boost::unordered_map<std::string, uint32_t>& vocab_;
  uint32_t unk_;
  std::vector<uint32_t> memo_;  // by Factor::GetId(); kUnset: not looked up yet
  static const uint32_t kUnset = 0xffffffffu;
};

// A phrase's scores from the log-probabilities `lp` of its n-grams as cslm_ngrams.h lists them: the first
// `internal` (whole history inside the phrase) added to `scores`, the next `estimate` (its first words'
// future-cost estimate) to `estimated` when there are any; the second score, where `ff` has one, counts the
// phrase's words `ids` that are `unk` (outside the shortlist).
void AddPhraseScores(const FeatureFunction& ff, const std::vector<float>& lp, size_t internal, size_t estimate,
                     const std::vector<uint32_t>& ids, uint32_t unk, ScoreComponentCollection* scores,
                     ScoreComponentCollection* estimated);

// The number of `ids` equal to `unk`.
size_t CountUnknown(const std::vector<uint32_t>& ids, uint32_t unk);

// Scores `count` rows of `width` ids each into logprobs[0..count): those the
// cache holds from it (added to *hits), the others in one call to `session`,
// then cached. Stops the decoder (CSLMFatal) if the backend cannot answer.
void ScoreThroughCache(const std::string& who, cslm::NgramCache* cache, cslm::Backend::Session* session,
                       const std::vector<uint32_t>& rows, unsigned width, size_t count, std::vector<float>* logprobs,
                       size_t* hits);

// The end of a sentence in one thread: with `stats`, one line on stderr (requests,
// `rows` evaluated, cache hits, hidden layers computed); then the session's
// counters and *hits start again from 0. With `forget` (the buffer: a
// sentence's n-grams are asked for a stack at a time, and another sentence's
// save a few percent of them) the cache is emptied, so that it stays as small
// as one sentence needs and its look-ups hit the processor's caches; else a
// cache more than half full is emptied, so that the next sentence seldom
// meets an emptying halfway (which would lose what its earlier stacks were
// answered: a server asked again, the buffer's run ahead guessing them again).
void EndSentence(const std::string& who, long sentence, bool stats, const char* rows, cslm::Backend::Session* session,
                 cslm::NgramCache* cache, size_t* hits, bool forget);

}  // namespace Moses
