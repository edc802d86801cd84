// CSLM.h -- Moses feature function: a continuous-space language model
// (Cho et al., 2014, Sec. 4.1.2 and the word penalty), evaluated in the
// decoder's process or served by `cslm serve` over TCP.
//
//   [feature]
//   CSLM name=CSLM0 path=/models/cslm order=7                       # in process (CPU)
//   CSLM name=CSLM0 path=/models/cslm order=7 future-cost=false     # ... without the CSLM in the estimate
//   CSLM name=CSLM0 path=/models/cslm port=5107 buffer=4096          # a server (GPU, shared)
//   CSLM name=CSLM0 path=/models/cslm port=5107 buffer=4096 predict=0 corner=16  # ... asking 16 expansions a cube ahead
//   [weight]
//   CSLM0= 0.1 -0.1
//
// In process (no port=): cslm::LocalBackend reads the model directory; a
// self-normalised model (`cslm train --self-norm`) is asked for o_w alone,
// another for the exact softmax (self-normalized=auto|true|false).
// Through a server (port=): one request per hypothesis whose n-grams miss the
// cache (with prefetch), or, with buffer=N, one request per N queued n-grams
// or per stack, in the normal stack search and under cube pruning (there
// what each stack's search will most likely create, run ahead, and one more
// per cube whose search leaves that; CSLMBuffer.h).
//
// Scores: (1) the natural-log probability of the target words (and of </s>
// when a hypothesis completes the sentence); (2) with num-features=2 (the
// default), the number of target words outside the network's shortlist.
// Phrase-based decoding only. See docs/moses-feature.md for building it
// into a Moses checkout.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include <boost/scoped_ptr.hpp>
#include <boost/thread/tss.hpp>
#include <boost/unordered_map.hpp>

#include "moses/FF/FFState.h"
#include "moses/FF/StatefulFeatureFunction.h"
#include "moses/FactorTypeSet.h"
#include "CSLMShared.h"

namespace cslm {
class Backend;
class NgramCache;
}

namespace Moses {

class Factor;
class Phrase;
class TranslationOption;

// The last order-1 target words (server ids), the sentence start being <s>.
// Up to kInline of them are kept in the state itself: a decoder makes one
// state per hypothesis, and a 7-gram's six words then cost no allocation.
class CSLMState : public FFState {
 public:
  explicit CSLMState(const std::vector<uint32_t>& words);
  const uint32_t* Words() const { return m_size <= kInline ? m_inline : &m_heap[0]; }
  size_t Size() const { return m_size; }
  size_t hash() const;
  bool operator==(const FFState& other) const;

 private:
  static const size_t kInline = 7;
  uint32_t m_inline[kInline];
  size_t m_size;
  std::vector<uint32_t> m_heap;  // the words, when more than kInline
};

class CSLM : public StatefulFeatureFunction {
 public:
  explicit CSLM(const std::string& line);
  ~CSLM();

  void SetParameter(const std::string& key, const std::string& value);
  void Load(AllOptions::ptr const& opts);
  bool IsUseable(const FactorMask& mask) const { return mask[m_opt.factor]; }

  const FFState* EmptyHypothesisState(const InputType& input) const;

  // In process (future-cost=true, the default there): each target phrase's
  // internal n-grams and unknown-word count (real scores), and an estimate of
  // its first order-1 words with the history the phrase gives them, <s>-padded
  // (estimatedScores: the search's future cost only). As Moses's own LMs do.
  void EvaluateInIsolation(const Phrase& source, const TargetPhrase& targetPhrase,
                           ScoreComponentCollection& scoreBreakdown,
                           ScoreComponentCollection& estimatedScores) const;

  // Otherwise (a server: one request per list instead of one per phrase):
  // phrase-internal n-grams and the unknown-word count, for every option of
  // the list in one request. Moses has fixed each option's future cost by then.
  void EvaluateTranslationOptionListWithSourceContext(const InputType& input,
                                                      const TranslationOptionList& list) const;

  // Boundary n-grams (history reaching into the previous hypothesis) and </s>.
  FFState* EvaluateWhenApplied(const Hypothesis& hypo, const FFState* prev_state,
                               ScoreComponentCollection* accumulator) const;
  FFState* EvaluateWhenApplied(const ChartHypothesis& hypo, int featureID,
                               ScoreComponentCollection* accumulator) const;

  // The buffer (CSLMBuffer.h). BufferSize: n-grams per buffered request.
  // Corner, Ahead: under cube pruning, how many expansions of a new cube are
  // asked for ahead, and by what factor that grows each time the cube's
  // successors miss.
  // Queue: adds the boundary n-grams of a new hypothesis that the cache lacks to
  // this thread's queue; returns the queue's length. QueueExpansion: the same
  // for the hypothesis that `option` would make from `prev` (`complete`: it
  // would cover the whole source), without making it. Queued: the queue's
  // length. ScoreQueued: scores the queue into the cache (one request per
  // BufferSize n-grams) and empties it.
  size_t BufferSize() const { return m_buffer; }
  size_t Corner() const { return m_corner; }
  size_t Ahead() const { return m_ahead; }
  // Under cube pruning with the buffer: P > 0 (default 1.25) asks, before each
  // stack, for what that stack's cube pruning creates when run ahead for P
  // times its pop limit; 0 asks for each new cube's corner instead (CSLMBuffer.h).
  float Predict() const { return m_predict; }
  // How the run ahead scores a cell (run-ahead=): true (evaluate, the
  // default) evaluates the hypothesis the cell would make with every feature,
  // the CSLM's n-grams from the cache (RunAhead below); false (estimate) adds
  // the predecessor's score, the option's future score and the distortion cost.
  // Rounds: run-aheads per stack with evaluate, each asking for what the
  // previous ones did not know (rounds=, default 1).
  bool EvaluateRunAhead() const { return m_evaluateRunAhead; }
  size_t Rounds() const { return m_rounds; }
  // While on (this thread): EvaluateWhenApplied never asks the backend; each
  // boundary n-gram the cache lacks is queued, counted in RunAheadMisses and
  // given a provisional value, for the run ahead only: the mean log-probability
  // of the n-grams this thread has been answered that end in the same words
  // (cslm::SuffixMeans: the last three, shrunk towards the last two, the last
  // word and all).
  void RunAhead(bool on) const;
  size_t RunAheadMisses() const;
  size_t Queue(const Hypothesis& hypo) const;
  size_t QueueExpansion(const Hypothesis& prev, const TranslationOption& option, bool complete) const;
  size_t Queued() const;
  void ScoreQueued() const;

 protected:
  // Per sentence (stats=1): requests, n-grams evaluated, cache hits.
  void CleanUpAfterSentenceProcessing(const InputType& source);

 private:
  struct ThreadData;  // one backend session, its caches

  ThreadData& ThisThread() const;
  void PhraseIds(ThreadData& td, const Phrase& phrase, std::vector<uint32_t>* ids) const;
  // Scores `count` n-grams of m_order ids each, through the thread's cache.
  void Score(ThreadData& td, const std::vector<uint32_t>& ngrams, size_t count, std::vector<float>* logprobs) const;
  // Evaluates `count` n-grams (no cache) through the thread's backend session
  // (cslm_backend.h: in process, or one request to the server with its
  // retries); stops the decoder if the backend cannot answer.
  void Evaluate(ThreadData& td, const uint32_t* ngrams, size_t count, float* logprobs, uint8_t* flags) const;
  void Fatal(const std::string& message) const;
  // True, with their log-probabilities, if the first `count` n-grams are all in the thread's cache.
  bool Cached(ThreadData& td, const std::vector<uint32_t>& ngrams, size_t count, std::vector<float>* logprobs) const;
  // Queues the boundary n-grams of `phrase` after `state` that neither the
  // cache nor the queue holds; returns the queue's length.
  size_t QueueNgrams(ThreadData& td, const CSLMState& state, const Phrase& phrase, bool complete) const;
  // Adds one n-gram (m_order ids) to the queue unless the cache has it,
  // answered or pending (queued already); it becomes pending.
  void QueueOne(ThreadData& td, const uint32_t* ngram) const;
  // The run ahead's sum of the first `count` n-grams' log-probabilities: the
  // cache's values, and for each n-gram it lacks the provisional value (the
  // mean of this thread's answers so far), the n-gram queued and counted.
  float RunAheadSum(ThreadData& td, const std::vector<uint32_t>& ngrams, size_t count) const;
  // Appends the boundary n-grams of `state` followed by up to m_prefetch other
  // options of hypo's source span.
  void AddPrefetch(ThreadData& td, const Hypothesis& hypo, const CSLMState& state,
                   std::vector<uint32_t>* ngrams) const;

  CSLMOptions m_opt;       // the keys NNJM takes too (CSLMShared.h); future_cost: -1 until Load decides
  std::string m_host;
  int m_port;              // -1: in process
  size_t m_buffer;         // n-grams per buffered request; 0: no buffer
  size_t m_corner;         // cube pruning with the buffer: a new cube's expansions (x+1)(y+1) <= corner asked ahead
  size_t m_ahead;          // ... and each time a cube leaves what was asked, `ahead` times more of it
  float m_predict;         // > 0: instead of corners, the cells of a run ahead of each stack (predict x pop limit pops)
  bool m_evaluateRunAhead; // run-ahead=evaluate (true) or estimate
  size_t m_rounds;         // run-aheads per stack (evaluate)
  unsigned m_order;        // the server's n (order= in the ini must agree)
  double m_timeout;        // seconds, connect and every reply
  int m_retries;
  size_t m_prefetch;       // other options of the span whose boundary n-grams share a request

  // Read-only after Load: shared by all threads.
  uint32_t m_bos, m_eos, m_unk;
  boost::unordered_map<std::string, uint32_t> m_vocab;
  boost::scoped_ptr<cslm::Backend> m_backend;  // in process or a server
  int m_stateIndex;        // this feature's slot among the hypothesis' states

  mutable boost::thread_specific_ptr<ThreadData> m_local;
};

}  // namespace Moses
