// NNJM.h -- Moses feature function: the neural network joint model (Devlin et
// al., 2014) trained by `cslm train TARGET --source SOURCE --alignment ALIGN`,
// evaluated in the decoder's process.
//
//   [feature]
//   NNJM name=NNJM0 path=/models/nnjm order=7 source_window=11
//   [weight]
//   NNJM0= 0.1 -0.1
//
// Each target word t_j of a hypothesis is scored with its n-1 target
// predecessors and the m source words centred on the source word it is
// affiliated to (cslm_affiliation.h): the affiliation comes from the phrase
// pair's word alignment (the phrase table's alignment column, which
// train-model.perl writes) and the hypothesis' source span, as in Moses's
// BilingualLM, whose ini names (order, source_window) this line shares.
//
// The state is the last n-1 target words, as the CSLM's (CSLMState): a word's
// source window depends on its own phrase pair only, so recombination stays
// exact. Per sentence, the source ids are looked up once and padded
// (cslm::padded_source); a window is then a slice of them. In process only
// (cslm::LocalBackend: premultiplied first-layer tables for the target and the
// source positions, a per-thread cache of hidden layers); `cslm serve` does not
// serve joint models (docs/moses-feature.md says why).
//
// Scores: (1) the natural-log probability of the target words (and of </s>
// when a hypothesis completes the sentence), as `cslm score --source
// --alignment` computes it given the decoder's affiliations; (2) with
// num-features=2 (the default), the number of target words outside the
// network's shortlist. Phrase-based decoding of plain sentences only.
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
}

namespace Moses {

class InputType;
class Phrase;
class TargetPhrase;

class NNJM : public StatefulFeatureFunction {
 public:
  explicit NNJM(const std::string& line);
  ~NNJM();

  void SetParameter(const std::string& key, const std::string& value);
  void Load(AllOptions::ptr const& opts);
  bool IsUseable(const FactorMask& mask) const { return mask[m_opt.factor]; }

  // The sentence start: <s> as the history.
  const FFState* EmptyHypothesisState(const InputType& input) const;

  // Once per translation option, its source span known: the n-grams whose
  // history lies inside the phrase and the unknown-word count (real scores),
  // and, with future-cost=true (the default), an estimate of the phrase's
  // first order-1 words with the history the phrase gives them, <s>-padded
  // (estimatedScores: the search's future cost only).
  void EvaluateWithSourceContext(const InputType& input, const InputPath& inputPath, const TargetPhrase& targetPhrase,
                                 const StackVec* stackVec, ScoreComponentCollection& scoreBreakdown,
                                 ScoreComponentCollection* estimatedScores = NULL) const;

  // Boundary words (history reaching into the previous hypothesis) and </s>.
  FFState* EvaluateWhenApplied(const Hypothesis& hypo, const FFState* prev_state,
                               ScoreComponentCollection* accumulator) const;
  FFState* EvaluateWhenApplied(const ChartHypothesis& hypo, int featureID,
                               ScoreComponentCollection* accumulator) const;

 protected:
  // Per sentence (stats=1): rows evaluated, cache hits, hidden layers computed.
  void CleanUpAfterSentenceProcessing(const InputType& source);

 private:
  struct ThreadData;  // one backend session, its caches, this sentence's source

  ThreadData& ThisThread() const;
  // The sentence's padded source ids (cslm::padded_source), made once per sentence.
  const std::vector<uint32_t>& Source(ThreadData& td, const InputType& input) const;
  // The source index (in the sentence) each word of `phrase` is affiliated to,
  // its source span starting at `start` and `src_len` words long (valid until
  // the next call).
  const std::vector<size_t>& Affiliations(ThreadData& td, const TargetPhrase& phrase, size_t start,
                                          size_t src_len) const;

  CSLMOptions m_opt;       // the keys CSLM takes too (CSLMShared.h); future_cost -1 (not given) is true here
  unsigned m_iniWindow;    // source_window= (0 if not given): must be the model's m
  FactorType m_sourceFactorType;  // the source words'

  // Read-only after Load: shared by all threads.
  unsigned m_order, m_window, m_rowSize;
  uint32_t m_bos, m_eos, m_unk, m_srcBos, m_srcEos, m_srcUnk;
  boost::unordered_map<std::string, uint32_t> m_vocab, m_srcVocab;
  boost::scoped_ptr<cslm::Backend> m_backend;

  mutable boost::thread_specific_ptr<ThreadData> m_local;
};

}  // namespace Moses
