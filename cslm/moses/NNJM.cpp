// NNJM.cpp -- see NNJM.h and docs/moses-feature.md.
#include "NNJM.h"

#include <iostream>
#include <stdexcept>

#include "CSLM.h"  // CSLMState: the last order-1 target ids
#include "CSLMShared.h"
#include "cslm_affiliation.h"
#include "cslm_backend.h"
#include "cslm_ngrams.h"
#include "moses/AlignmentInfo.h"
#include "moses/Factor.h"
#include "moses/Hypothesis.h"
#include "moses/InputPath.h"
#include "moses/InputType.h"
#include "moses/Manager.h"
#include "moses/Phrase.h"
#include "moses/Range.h"
#include "moses/ScoreComponentCollection.h"
#include "moses/Sentence.h"
#include "moses/TargetPhrase.h"
#include "moses/Word.h"
#include "util/exception.hh"

namespace Moses {

struct NNJM::ThreadData {
  ThreadData(cslm::Backend::Session* s, size_t cache_size, const boost::unordered_map<std::string, uint32_t>& vocab,
             uint32_t unk, const boost::unordered_map<std::string, uint32_t>& src_vocab, uint32_t src_unk)
      : session(s), cache(cache_size), ids(vocab, unk), src_ids(src_vocab, src_unk), input(NULL), translation_id(-1),
        hits(0) {}
  boost::scoped_ptr<cslm::Backend::Session> session;  // the in-process evaluator's working memory
  cslm::NgramCache cache;                             // rows -> log-probability
  FactorIds ids, src_ids;                             // target and source words -> ids
  const InputType* input;                             // the sentence `source` belongs to
  long translation_id;
  std::vector<uint32_t> source;                       // its padded source ids
  std::vector<std::vector<size_t> > aligned;          // Affiliations's working memory
  std::vector<size_t> local, affil;
  std::vector<uint32_t> phrase_ids, ngrams, next, rows, src_word_ids;  // the Evaluate methods'
  std::vector<float> lp, scores;
  size_t hits;                                        // this sentence's cache hits (stats=1)
};

NNJM::NNJM(const std::string& line)
    : StatefulFeatureFunction(2, line),
      m_iniWindow(0),
      m_sourceFactorType(0),
      m_order(0),
      m_window(0),
      m_rowSize(0),
      m_bos(0),
      m_eos(0),
      m_unk(0),
      m_srcBos(0),
      m_srcEos(0),
      m_srcUnk(0) {
  ReadParameters();
  UTIL_THROW_IF2(m_numScoreComponents < 1 || m_numScoreComponents > 2,
                 GetScoreProducerDescription() << ": num-features must be 1 (log-probability) or 2 "
                                                  "(log-probability, unknown words)");
  UTIL_THROW_IF2(m_opt.path.empty(), GetScoreProducerDescription() << ": give path=MODEL_DIR (a joint model of "
                                                                  "`cslm train --source --alignment`)");
}

NNJM::~NNJM() {}

void NNJM::SetParameter(const std::string& key, const std::string& value) {
  const std::string who = GetScoreProducerDescription();
  if (m_opt.Set(who, key, value)) return;  // the keys CSLM takes too
  if (key == "source_window") {
    m_iniWindow = ScanNumber<unsigned>(who, key, value, 0, 1001);
  } else if (key == "source-factor") {
    m_sourceFactorType = ScanNumber<FactorType>(who, key, value, 0, MAX_NUM_FACTORS - 1);
  } else {
    StatefulFeatureFunction::SetParameter(key, value);
  }
}

void NNJM::Load(AllOptions::ptr const& opts) {
  m_options = opts;
  const std::string who = GetScoreProducerDescription();
  bool self_normalized = false;
  size_t table_mib = 0;
  try {
    cslm::LocalBackend* local =
        new cslm::LocalBackend(m_opt.path, m_opt.self_norm, m_opt.history_cache, m_opt.floor, m_opt.precision);
    m_backend.reset(local);
    self_normalized = local->self_normalized();
    table_mib = local->model().table_bytes() / (1 << 20);
    if (self_normalized && !local->model().self_normalized())
      std::cerr << who << ": warning: self-normalized=true but " << m_opt.path
                << " was trained without --self-norm or --objective nce: its o_w are not log-probabilities"
                << std::endl;
    const cslm::ModelFacts& facts = m_backend->facts();
    if (!facts.source_window)
      throw std::runtime_error(m_opt.path + " is a target-only CSLM (no source window): load it with a CSLM line");
  } catch (const std::exception& e) {
    UTIL_THROW2(who << ": cannot load the joint model: " << e.what());
  }
  const cslm::ModelFacts& facts = m_backend->facts();
  m_order = facts.order;
  m_window = facts.source_window;
  m_rowSize = m_order + m_window;
  m_bos = facts.bos;
  m_eos = facts.eos;
  m_unk = facts.unk;
  m_srcBos = facts.source_bos;
  m_srcEos = facts.source_eos;
  m_srcUnk = facts.source_unk;
  UTIL_THROW_IF2(m_opt.order && m_opt.order != m_order,
                 who << ": moses.ini says order=" << m_opt.order << " but " << m_opt.path << " is a " << m_order
                     << "-gram joint model");
  UTIL_THROW_IF2(m_iniWindow && m_iniWindow != m_window,
                 who << ": moses.ini says source_window=" << m_iniWindow << " but " << m_opt.path
                     << " has a source window of " << m_window);
  m_opt.cache_size = m_opt.CacheSize(true, self_normalized, 0);
  for (size_t i = 0; i < facts.words.size(); ++i) m_vocab[facts.words[i]] = static_cast<uint32_t>(i);
  for (size_t i = 0; i < facts.source_words.size(); ++i) m_srcVocab[facts.source_words[i]] = static_cast<uint32_t>(i);
  std::cerr << who << ": joint model " << m_backend->Where() << ", order " << m_order << ", source window "
            << m_window << ", vocabularies " << facts.words.size() << " target and " << facts.source_words.size()
            << " source, " << (self_normalized ? "self-normalised (o_w)" : "exact softmax")
            << ", premultiplied tables " << table_mib << " MiB"
            << (m_opt.future_cost != 0 ? ", in the future-cost estimate" : "") << ", n-gram cache "
            << m_opt.cache_size << " per thread" << std::endl;
}

NNJM::ThreadData& NNJM::ThisThread() const {
  ThreadData* td = m_local.get();
  if (!td) {
    td = new ThreadData(m_backend->NewSession(), m_opt.cache_size, m_vocab, m_unk, m_srcVocab, m_srcUnk);
    m_local.reset(td);
  }
  return *td;
}

const FFState* NNJM::EmptyHypothesisState(const InputType& /*input*/) const {
  return new CSLMState(std::vector<uint32_t>(1, m_bos));
}

const std::vector<uint32_t>& NNJM::Source(ThreadData& td, const InputType& input) const {
  if (td.input == &input && td.translation_id == input.GetTranslationId()) return td.source;
  const Sentence* sentence = dynamic_cast<const Sentence*>(&input);
  if (!sentence)
    CSLMFatal(GetScoreProducerDescription(), "the joint model reads plain sentences (no lattices or confusion networks)");
  td.input = &input;
  td.translation_id = input.GetTranslationId();
  td.src_ids.Phrase(*sentence, m_sourceFactorType, &td.src_word_ids);
  cslm::padded_source(td.src_word_ids, m_window, m_srcBos, m_srcEos, &td.source);
  return td.source;
}

const std::vector<size_t>& NNJM::Affiliations(ThreadData& td, const TargetPhrase& phrase, size_t start,
                                              size_t src_len) const {
  std::vector<size_t>& out = td.affil;
  td.aligned.resize(phrase.GetSize());
  for (size_t j = 0; j < td.aligned.size(); ++j) td.aligned[j].clear();
  // AlignmentInfo is a std::set of (source, target) pairs: in its order each word's source
  // indices arrive ascending and once, as phrase_affiliations wants them
  const AlignmentInfo& alignment = phrase.GetAlignTerm();
  for (AlignmentInfo::const_iterator it = alignment.begin(); it != alignment.end(); ++it)
    if (it->second < td.aligned.size() && it->first < src_len) td.aligned[it->second].push_back(it->first);
  cslm::phrase_affiliations(td.aligned, src_len, &td.local);
  out.resize(td.local.size());
  for (size_t j = 0; j < td.local.size(); ++j) out[j] = start + td.local[j];
  return out;
}

void NNJM::EvaluateWithSourceContext(const InputType& input, const InputPath& inputPath,
                                     const TargetPhrase& targetPhrase, const StackVec* /*stackVec*/,
                                     ScoreComponentCollection& scoreBreakdown,
                                     ScoreComponentCollection* estimatedScores) const {
  ThreadData& td = ThisThread();
  const std::vector<uint32_t>& source = Source(td, input);
  const Range& span = inputPath.GetWordsRange();
  std::vector<uint32_t>& ids = td.phrase_ids;
  td.ids.Phrase(targetPhrase, m_opt.factor, &ids);
  const std::vector<size_t>& affil =
      Affiliations(td, targetPhrase, span.GetStartPos(), span.GetNumWordsCovered());
  // The words from order-1 on have their whole history in the phrase (real
  // scores); the first ones, with the phrase's own <s>-padded history, an
  // estimate. Each row takes its word's window (cslm_affiliation.h).
  std::vector<uint32_t>& ngrams = td.ngrams;
  ngrams.clear();
  const size_t internal = cslm::internal_ngrams(ids, m_order, m_bos, &ngrams);
  const size_t estimate = m_opt.future_cost != 0 && estimatedScores ? cslm::estimate_ngrams(ids, m_order, m_bos, &ngrams) : 0;
  td.rows.clear();
  for (size_t k = 0; k < internal + estimate; ++k) {
    const size_t word = k < internal ? m_order - 1 + k : k - internal;  // its index in the phrase
    cslm::append_joint_row(&ngrams[k * m_order], m_order, &source[affil[word]], m_window, &td.rows);
  }
  std::vector<float>& lp = td.lp;
  if (internal + estimate)
    ScoreThroughCache(GetScoreProducerDescription(), &td.cache, td.session.get(), td.rows, m_rowSize,
                      internal + estimate, &lp, &td.hits);
  AddPhraseScores(*this, lp, internal, estimate, ids, m_unk, &scoreBreakdown, estimatedScores);
}

FFState* NNJM::EvaluateWhenApplied(const Hypothesis& hypo, const FFState* prev_state,
                                   ScoreComponentCollection* accumulator) const {
  ThreadData& td = ThisThread();
  const InputType& input = hypo.GetManager().GetSource();
  const std::vector<uint32_t>& source = Source(td, input);
  const CSLMState& prev = static_cast<const CSLMState&>(*prev_state);
  const Range& span = hypo.GetCurrSourceWordsRange();
  const TargetPhrase& phrase = hypo.GetCurrTargetPhrase();
  td.ids.Phrase(phrase, m_opt.factor, &td.phrase_ids);
  const std::vector<size_t>& affil = Affiliations(td, phrase, span.GetStartPos(), span.GetNumWordsCovered());
  std::vector<uint32_t>& ngrams = td.ngrams;
  ngrams.clear();
  const bool complete = hypo.IsSourceCompleted();
  const size_t count =
      cslm::boundary_ngrams(prev.Words(), prev.Size(), td.phrase_ids, complete, m_order, m_bos, m_eos, &ngrams,
                            &td.next);
  if (count) {
    // boundary_ngrams: the phrase's first words in order, then </s> if complete,
    // whose window is centred on the source </s> (index = the sentence's length)
    const size_t sentence_length = source.size() - m_window;  // padded: m/2 + length + m/2 + 1
    td.rows.clear();
    for (size_t k = 0; k < count; ++k) {
      const size_t at = complete && k + 1 == count ? sentence_length : affil[k];
      cslm::append_joint_row(&ngrams[k * m_order], m_order, &source[at], m_window, &td.rows);
    }
    ScoreThroughCache(GetScoreProducerDescription(), &td.cache, td.session.get(), td.rows, m_rowSize, count, &td.lp,
                      &td.hits);
    float sum = 0.0f;
    for (size_t i = 0; i < count; ++i) sum += td.lp[i];
    td.scores.assign(m_numScoreComponents, 0.0f);
    td.scores[0] = sum;
    accumulator->PlusEquals(this, td.scores);
  }
  return new CSLMState(td.next);
}

void NNJM::CleanUpAfterSentenceProcessing(const InputType& source) {
  ThreadData& td = ThisThread();
  EndSentence(GetScoreProducerDescription(), source.GetTranslationId(), m_opt.stats, "rows", td.session.get(),
              &td.cache, &td.hits, false);
}

FFState* NNJM::EvaluateWhenApplied(const ChartHypothesis& /*hypo*/, int /*featureID*/,
                                   ScoreComponentCollection* /*accumulator*/) const {
  UTIL_THROW2(GetScoreProducerDescription() << ": the NNJM feature supports phrase-based decoding only");
}

}  // namespace Moses
