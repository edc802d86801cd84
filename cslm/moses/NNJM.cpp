// NNJM.cpp -- see NNJM.h and docs/moses-feature.md.
#include "NNJM.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "CSLM.h"  // CSLMState: the last order-1 target ids
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
  ThreadData(cslm::Backend::Session* s, size_t cache_size)
      : session(s), cache(cache_size), input(NULL), translation_id(-1), hits(0) {}
  boost::scoped_ptr<cslm::Backend::Session> session;  // the in-process evaluator's working memory
  cslm::NgramCache cache;                             // rows -> log-probability
  boost::unordered_map<const Factor*, uint32_t> ids;  // target word -> id memo
  boost::unordered_map<const Factor*, uint32_t> src_ids;  // source word -> id memo
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
      m_iniOrder(0),
      m_iniWindow(0),
      m_selfNorm(-1),
      m_historyCache(16384),
      m_cacheSize(1000000),
      m_floor(-100.0f),
      m_futureCost(true),
      m_stats(false),
      m_factorType(0),
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
  UTIL_THROW_IF2(m_path.empty(), GetScoreProducerDescription() << ": give path=MODEL_DIR (a joint model of "
                                                                  "`cslm train --source --alignment`)");
}

NNJM::~NNJM() {}

void NNJM::SetParameter(const std::string& key, const std::string& value) {
  if (key == "path") {
    m_path = value;
  } else if (key == "order") {
    m_iniOrder = Scan<unsigned>(value);
  } else if (key == "source_window") {
    m_iniWindow = Scan<unsigned>(value);
  } else if (key == "factor") {
    m_factorType = Scan<FactorType>(value);
  } else if (key == "source-factor") {
    m_sourceFactorType = Scan<FactorType>(value);
  } else if (key == "history-cache") {
    m_historyCache = Scan<size_t>(value);
  } else if (key == "cache-size") {
    m_cacheSize = Scan<size_t>(value);
  } else if (key == "floor") {
    m_floor = Scan<float>(value);
  } else if (key == "future-cost") {
    m_futureCost = Scan<bool>(value);
  } else if (key == "stats") {
    m_stats = Scan<bool>(value);
  } else if (key == "self-normalized") {
    UTIL_THROW_IF2(value != "auto" && value != "true" && value != "false",
                   GetScoreProducerDescription() << ": self-normalized= must be auto, true or false");
    m_selfNorm = value == "auto" ? -1 : value == "true";
  } else {
    StatefulFeatureFunction::SetParameter(key, value);
  }
}

void NNJM::Fatal(const std::string& message) const {
  // Called from a decoder thread: say why and stop the whole process now.
  std::cerr << "\n" << GetScoreProducerDescription() << ": " << message << std::endl;
  std::cout.flush();
  std::fflush(stdout);
  _exit(1);
}

namespace {
// The id of `word` in `words`; throws naming the file if it is missing.
uint32_t Reserved(const std::vector<std::string>& words, const std::string& word, const std::string& file) {
  std::vector<std::string>::const_iterator it = std::find(words.begin(), words.end(), word);
  if (it == words.end()) throw std::runtime_error(file + ": has no " + word);
  return static_cast<uint32_t>(it - words.begin());
}
}  // namespace

void NNJM::Load(AllOptions::ptr const& opts) {
  m_options = opts;
  const std::string who = GetScoreProducerDescription();
  bool self_normalized = false;
  size_t table_mib = 0;
  try {
    cslm::LocalBackend* local = new cslm::LocalBackend(m_path, m_selfNorm, m_historyCache, m_floor);
    m_backend.reset(local);
    self_normalized = local->self_normalized();
    table_mib = local->model().table_bytes() / (1 << 20);
    if (self_normalized && !local->model().self_normalized())
      std::cerr << who << ": warning: self-normalized=true but " << m_path
                << " was trained without --self-norm or --objective nce: its o_w are not log-probabilities"
                << std::endl;
    const cslm::ModelFacts& facts = m_backend->facts();
    if (!facts.source_window)
      throw std::runtime_error(m_path + " is a target-only CSLM (no source window): load it with a CSLM line");
    const std::string src_vocab = m_path + "/cslm.src.vocab";
    m_srcBos = Reserved(facts.source_words, facts.words[facts.bos], src_vocab);
    m_srcEos = Reserved(facts.source_words, facts.words[facts.eos], src_vocab);
    m_srcUnk = Reserved(facts.source_words, facts.words[facts.unk], src_vocab);
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
  UTIL_THROW_IF2(m_iniOrder && m_iniOrder != m_order,
                 who << ": moses.ini says order=" << m_iniOrder << " but " << m_path << " is a " << m_order
                     << "-gram joint model");
  UTIL_THROW_IF2(m_iniWindow && m_iniWindow != m_window,
                 who << ": moses.ini says source_window=" << m_iniWindow << " but " << m_path
                     << " has a source window of " << m_window);
  for (size_t i = 0; i < facts.words.size(); ++i) m_vocab[facts.words[i]] = static_cast<uint32_t>(i);
  for (size_t i = 0; i < facts.source_words.size(); ++i) m_srcVocab[facts.source_words[i]] = static_cast<uint32_t>(i);
  std::cerr << who << ": joint model " << m_backend->Where() << ", order " << m_order << ", source window "
            << m_window << ", vocabularies " << facts.words.size() << " target and " << facts.source_words.size()
            << " source, " << (self_normalized ? "self-normalised (o_w)" : "exact softmax")
            << ", premultiplied tables " << table_mib << " MiB"
            << (m_futureCost ? ", in the future-cost estimate" : "") << std::endl;
}

NNJM::ThreadData& NNJM::ThisThread() const {
  ThreadData* td = m_local.get();
  if (!td) {
    td = new ThreadData(m_backend->NewSession(), m_cacheSize);
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
  if (!sentence) Fatal("the joint model reads plain sentences (no lattices or confusion networks)");
  td.input = &input;
  td.translation_id = input.GetTranslationId();
  td.src_word_ids.clear();
  for (size_t i = 0; i < sentence->GetSize(); ++i) {
    const Factor* f = sentence->GetWord(i).GetFactor(m_sourceFactorType);
    boost::unordered_map<const Factor*, uint32_t>::const_iterator it = td.src_ids.find(f);
    uint32_t id = m_srcUnk;
    if (it != td.src_ids.end()) {
      id = it->second;
    } else {
      if (f) {
        boost::unordered_map<std::string, uint32_t>::const_iterator v = m_srcVocab.find(f->GetString().as_string());
        if (v != m_srcVocab.end()) id = v->second;
      }
      td.src_ids[f] = id;
    }
    td.src_word_ids.push_back(id);
  }
  cslm::padded_source(td.src_word_ids, m_window, m_srcBos, m_srcEos, &td.source);
  return td.source;
}

void NNJM::PhraseIds(ThreadData& td, const Phrase& phrase, std::vector<uint32_t>* ids) const {
  ids->clear();
  for (size_t i = 0; i < phrase.GetSize(); ++i) {
    const Factor* f = phrase.GetWord(i).GetFactor(m_factorType);
    boost::unordered_map<const Factor*, uint32_t>::const_iterator it = td.ids.find(f);
    if (it != td.ids.end()) {
      ids->push_back(it->second);
      continue;
    }
    uint32_t id = m_unk;
    if (f) {
      boost::unordered_map<std::string, uint32_t>::const_iterator v = m_vocab.find(f->GetString().as_string());
      if (v != m_vocab.end()) id = v->second;
    }
    td.ids[f] = id;
    ids->push_back(id);
  }
}

const std::vector<size_t>& NNJM::Affiliations(ThreadData& td, const TargetPhrase& phrase, size_t start,
                                              size_t src_len) const {
  std::vector<size_t>& out = td.affil;
  td.aligned.resize(phrase.GetSize());
  for (size_t j = 0; j < td.aligned.size(); ++j) td.aligned[j].clear();
  const AlignmentInfo& alignment = phrase.GetAlignTerm();
  for (AlignmentInfo::const_iterator it = alignment.begin(); it != alignment.end(); ++it)
    if (it->second < td.aligned.size() && it->first < src_len) td.aligned[it->second].push_back(it->first);
  for (size_t j = 0; j < td.aligned.size(); ++j) {  // ascending, each once (Moses's std::set order)
    std::sort(td.aligned[j].begin(), td.aligned[j].end());
    td.aligned[j].erase(std::unique(td.aligned[j].begin(), td.aligned[j].end()), td.aligned[j].end());
  }
  cslm::phrase_affiliations(td.aligned, src_len, &td.local);
  out.resize(td.local.size());
  for (size_t j = 0; j < td.local.size(); ++j) out[j] = start + td.local[j];
  return out;
}

void NNJM::Score(ThreadData& td, const std::vector<uint32_t>& rows, size_t count,
                 std::vector<float>* logprobs) const {
  logprobs->assign(count, 0.0f);
  std::vector<uint32_t> missing;
  std::vector<size_t> where;
  for (size_t i = 0; i < count; ++i) {
    uint8_t flags;
    if (!td.cache.find(&rows[i * m_rowSize], m_rowSize, &(*logprobs)[i], &flags)) {
      missing.insert(missing.end(), rows.begin() + i * m_rowSize, rows.begin() + (i + 1) * m_rowSize);
      where.push_back(i);
    }
  }
  td.hits += count - where.size();
  if (where.empty()) return;
  std::vector<float> lp(where.size());
  std::vector<uint8_t> fl(where.size());
  try {
    td.session->Evaluate(&missing[0], where.size(), &lp[0], &fl[0]);
  } catch (const std::exception& e) {
    Fatal(std::string(e.what()) + "; stopping the decoder");
  }
  for (size_t k = 0; k < where.size(); ++k) {
    (*logprobs)[where[k]] = lp[k];
    td.cache.insert(&missing[k * m_rowSize], m_rowSize, lp[k], fl[k]);
  }
}

void NNJM::EvaluateWithSourceContext(const InputType& input, const InputPath& inputPath,
                                     const TargetPhrase& targetPhrase, const StackVec* /*stackVec*/,
                                     ScoreComponentCollection& scoreBreakdown,
                                     ScoreComponentCollection* estimatedScores) const {
  ThreadData& td = ThisThread();
  const std::vector<uint32_t>& source = Source(td, input);
  const Range& span = inputPath.GetWordsRange();
  std::vector<uint32_t>& ids = td.phrase_ids;
  PhraseIds(td, targetPhrase, &ids);
  const std::vector<size_t>& affil =
      Affiliations(td, targetPhrase, span.GetStartPos(), span.GetNumWordsCovered());
  // The words from order-1 on have their whole history in the phrase (real
  // scores); the first ones, with the phrase's own <s>-padded history, an
  // estimate. Each row takes its word's window (cslm_affiliation.h).
  std::vector<uint32_t>& ngrams = td.ngrams;
  ngrams.clear();
  const size_t internal = cslm::internal_ngrams(ids, m_order, m_bos, &ngrams);
  const size_t estimate = m_futureCost && estimatedScores ? cslm::estimate_ngrams(ids, m_order, m_bos, &ngrams) : 0;
  td.rows.clear();
  for (size_t k = 0; k < internal + estimate; ++k) {
    const size_t word = k < internal ? m_order - 1 + k : k - internal;  // its index in the phrase
    cslm::append_joint_row(&ngrams[k * m_order], m_order, &source[affil[word]], m_window, &td.rows);
  }
  std::vector<float>& lp = td.lp;
  if (internal + estimate) Score(td, td.rows, internal + estimate, &lp);
  std::vector<float> scores(m_numScoreComponents, 0.0f), future(m_numScoreComponents, 0.0f);
  for (size_t k = 0; k < internal; ++k) scores[0] += lp[k];
  for (size_t k = internal; k < internal + estimate; ++k) future[0] += lp[k];
  if (m_numScoreComponents > 1)
    for (size_t i = 0; i < ids.size(); ++i) scores[1] += ids[i] == m_unk;
  scoreBreakdown.PlusEquals(this, scores);
  if (estimate) estimatedScores->PlusEquals(this, future);
}

FFState* NNJM::EvaluateWhenApplied(const Hypothesis& hypo, const FFState* prev_state,
                                   ScoreComponentCollection* accumulator) const {
  ThreadData& td = ThisThread();
  const InputType& input = hypo.GetManager().GetSource();
  const std::vector<uint32_t>& source = Source(td, input);
  const CSLMState& prev = static_cast<const CSLMState&>(*prev_state);
  const Range& span = hypo.GetCurrSourceWordsRange();
  const TargetPhrase& phrase = hypo.GetCurrTargetPhrase();
  PhraseIds(td, phrase, &td.phrase_ids);
  const std::vector<size_t>& affil = Affiliations(td, phrase, span.GetStartPos(), span.GetNumWordsCovered());
  std::vector<uint32_t>& ngrams = td.ngrams;
  ngrams.clear();
  const bool complete = hypo.IsSourceCompleted();
  const size_t count =
      cslm::boundary_ngrams(prev.Words(), td.phrase_ids, complete, m_order, m_bos, m_eos, &ngrams, &td.next);
  if (count) {
    // boundary_ngrams: the phrase's first words in order, then </s> if complete,
    // whose window is centred on the source </s> (index = the sentence's length)
    const size_t sentence_length = source.size() - m_window;  // padded: m/2 + length + m/2 + 1
    td.rows.clear();
    for (size_t k = 0; k < count; ++k) {
      const size_t at = complete && k + 1 == count ? sentence_length : affil[k];
      cslm::append_joint_row(&ngrams[k * m_order], m_order, &source[at], m_window, &td.rows);
    }
    Score(td, td.rows, count, &td.lp);
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
  if (m_stats)
    std::cerr << GetScoreProducerDescription() << ": sentence " << source.GetTranslationId() << ": rows evaluated "
              << td.session->evaluated << ", cache hits " << td.hits << ", hidden layers computed "
              << td.session->HiddenComputed() << std::endl;
  td.session->ResetCounters();
  td.hits = 0;
}

FFState* NNJM::EvaluateWhenApplied(const ChartHypothesis& /*hypo*/, int /*featureID*/,
                                   ScoreComponentCollection* /*accumulator*/) const {
  UTIL_THROW2(GetScoreProducerDescription() << ": the NNJM feature supports phrase-based decoding only");
}

}  // namespace Moses
