// CSLM.cpp -- see CSLM.h and docs/moses-feature.md.
#include "CSLM.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include <boost/functional/hash.hpp>
#include <boost/scoped_ptr.hpp>

#include "CSLMBuffer.h"
#include "CSLMShared.h"
#include "cslm_backend.h"
#include "cslm_ngrams.h"
#include "moses/Factor.h"
#include "moses/Hypothesis.h"
#include "moses/InputType.h"
#include "moses/Manager.h"
#include "moses/Phrase.h"
#include "moses/ScoreComponentCollection.h"
#include "moses/TargetPhrase.h"
#include "moses/TranslationOption.h"
#include "moses/TranslationOptionCollection.h"
#include "moses/TranslationOptionList.h"
#include "moses/Word.h"
#include "util/exception.hh"

namespace Moses {

CSLMState::CSLMState(const std::vector<uint32_t>& words) : m_size(words.size()) {
  if (m_size <= kInline)
    std::copy(words.begin(), words.end(), m_inline);
  else
    m_heap = words;
}

size_t CSLMState::hash() const { return boost::hash_range(Words(), Words() + m_size); }

bool CSLMState::operator==(const FFState& other) const {
  const CSLMState& o = static_cast<const CSLMState&>(other);
  return m_size == o.m_size && std::equal(Words(), Words() + m_size, o.Words());
}

struct CSLM::ThreadData {
  ThreadData(cslm::Backend::Session* s, size_t cache_size,
             const boost::unordered_map<std::string, uint32_t>& vocab, uint32_t unk)
      : session(s), cache(cache_size), ids(vocab, unk), hits(0), run_ahead(false), run_ahead_misses(0) {}
  boost::scoped_ptr<cslm::Backend::Session> session;  // evaluates, in process or through a server
  cslm::NgramCache cache;                  // answers, and the queued n-grams as pending
  FactorIds ids;                           // this thread's word -> id memo
  std::vector<uint32_t> queued;            // the buffer: n-grams awaiting one request, each once (pending in the cache)
  std::vector<uint32_t> phrase_ids, ngrams, next;  // EvaluateWhenApplied's working memory
  std::vector<uint32_t> queue_ids, queue_ngrams, queue_next;  // QueueNgrams's
  std::vector<float> lp, scores;
  std::vector<uint8_t> flags;              // ScoreQueued's
  size_t hits;                             // this sentence's cache hits (stats=1)
  bool run_ahead;                          // RunAhead(true): nothing is asked, unknown n-grams are queued
  size_t run_ahead_misses;                 // ... and counted
  cslm::SuffixMeans provisional;           // the buffer's answers, for the run ahead's provisional values
};

CSLM::CSLM(const std::string& line)
    : StatefulFeatureFunction(2, line),
      m_host("127.0.0.1"),
      m_port(-1),
      m_buffer(0),
      m_corner(8),
      m_ahead(4),
      m_predict(1.25f),
      m_evaluateRunAhead(true),
      m_rounds(1),
      m_order(0),
      m_timeout(60.0),
      m_retries(3),
      m_prefetch(8),
      m_bos(0),
      m_eos(0),
      m_unk(0),
      m_stateIndex(-1) {
  ReadParameters();
  UTIL_THROW_IF2(m_numScoreComponents < 1 || m_numScoreComponents > 2,
                 GetScoreProducerDescription() << ": num-features must be 1 (log-probability) or 2 "
                                                  "(log-probability, unknown words)");
  UTIL_THROW_IF2(m_port != -1 && (m_port <= 0 || m_port > 65535),
                 GetScoreProducerDescription() << ": port= must be the port of `cslm serve` (1..65535)");
  UTIL_THROW_IF2(m_port == -1 && m_opt.path.empty(),
                 GetScoreProducerDescription() << ": give path=MODEL_DIR (in process) or port=N (a `cslm serve` server)");
}

CSLM::~CSLM() {}

void CSLM::SetParameter(const std::string& key, const std::string& value) {
  const std::string who = GetScoreProducerDescription();
  if (m_opt.Set(who, key, value)) return;  // the keys NNJM takes too
  if (key == "host") {
    m_host = value;
  } else if (key == "port") {
    m_port = ScanNumber<int>(who, key, value, 1, 65535);
  } else if (key == "timeout") {
    m_timeout = ScanNumber<double>(who, key, value, 0.001, 86400);
  } else if (key == "retries") {
    m_retries = ScanNumber<int>(who, key, value, 0, 100);
  } else if (key == "prefetch") {
    m_prefetch = ScanNumber<size_t>(who, key, value, 0, 1000000);
  } else if (key == "buffer") {
    m_buffer = ScanNumber<size_t>(who, key, value, 0, 16777216);
  } else if (key == "corner") {
    m_corner = ScanNumber<size_t>(who, key, value, 0, 1000000);
  } else if (key == "ahead") {
    m_ahead = ScanNumber<size_t>(who, key, value, 0, 1000000);
  } else if (key == "predict") {
    m_predict = ScanNumber<float>(who, key, value, 0, 1000);
  } else if (key == "run-ahead") {
    UTIL_THROW_IF2(value != "evaluate" && value != "estimate",
                   who << ": run-ahead= must be evaluate or estimate, not '" << value << "'");
    m_evaluateRunAhead = value == "evaluate";
  } else if (key == "rounds") {
    m_rounds = ScanNumber<size_t>(who, key, value, 1, 100);
  } else {
    StatefulFeatureFunction::SetParameter(key, value);
  }
}

void CSLM::Fatal(const std::string& message) const { CSLMFatal(GetScoreProducerDescription(), message); }

void CSLM::Load(AllOptions::ptr const& opts) {
  m_options = opts;
  const std::string who = GetScoreProducerDescription();
  const std::vector<const StatefulFeatureFunction*>& stateful = StatefulFeatureFunction::GetStatefulFeatureFunctions();
  for (size_t i = 0; i < stateful.size(); ++i)
    if (stateful[i] == this) m_stateIndex = static_cast<int>(i);
  UTIL_THROW_IF2(m_stateIndex < 0, who << ": not among the stateful features");

  std::string where, model;  // for the log line below
  bool self_normalized = false;
  if (m_port == -1) {  // in process: the model directory's weights
    try {
      cslm::LocalBackend* local = new cslm::LocalBackend(m_opt.path, m_opt.self_norm, m_opt.history_cache, m_opt.floor,
                                                       m_opt.precision);
      m_backend.reset(local);
      self_normalized = local->self_normalized();
      if (self_normalized && !local->model().self_normalized())
        std::cerr << who << ": warning: self-normalized=true but " << m_opt.path
                  << " was trained without --self-norm or --objective nce: its o_w are not log-probabilities"
                  << std::endl;
      std::ostringstream m;
      m << ", " << (self_normalized ? "self-normalised (o_w)" : "exact softmax") << ", premultiplied tables "
        << local->model().table_bytes() / (1 << 20) << " MiB";
      model = m.str();
    } catch (const std::exception& e) {
      UTIL_THROW2(who << ": cannot load the CSLM: " << e.what());
    }
    m_prefetch = 0;  // no round trips to fill
    if (m_opt.future_cost == -1) m_opt.future_cost = 1;
  } else {
    UTIL_THROW_IF2(m_opt.future_cost == 1, who << ": future-cost=true scores every target phrase on its own, one "
                                             "request each: in process only (give path= without port=)");
    m_opt.future_cost = 0;
    try {
      cslm::ServerBackend* server = new cslm::ServerBackend(m_host, static_cast<uint16_t>(m_port), m_timeout,
                                                            m_retries, m_opt.floor, m_opt.path, &std::cerr, who);
      m_backend.reset(server);
      model = ", checksum " + server->checksum().substr(0, 12);
    } catch (const cslm::Error& e) {  // cannot reach it, or it does not speak the protocol
      UTIL_THROW2(who << ": cannot use the CSLM server at " << m_host << ":" << m_port << ": " << e.what()
                      << "\n  Start it first: cslm serve MODEL_DIR --port " << m_port
                      << " (and check host=/port= on the CSLM line of moses.ini)");
    } catch (const std::exception& e) {  // it serves another model, or path= is no model directory
      UTIL_THROW2(who << ": " << e.what() << " (path= must be the model directory the server serves)");
    }
  }
  const cslm::ModelFacts& facts = m_backend->facts();
  where = m_backend->Where();
  // This feature gives the target history alone: a joint model would be scored without its source window.
  UTIL_THROW_IF2(facts.source_window, who << ": " << where << " is a joint model (source window "
                                          << facts.source_window << "): load it with an NNJM line, not CSLM");
  m_order = facts.order;
  m_bos = facts.bos;
  m_eos = facts.eos;
  m_unk = facts.unk;
  UTIL_THROW_IF2(m_order < 2, who << ": " << where << " reports order " << m_order);
  UTIL_THROW_IF2(m_opt.order && m_opt.order != m_order,
                 who << ": moses.ini says order=" << m_opt.order << " but " << where << " is a " << m_order
                     << "-gram model");
  for (size_t i = 0; i < facts.words.size(); ++i) m_vocab[facts.words[i]] = static_cast<uint32_t>(i);

  // The buffer works with the normal stack search without early discarding,
  // and with cube pruning (CSLMBuffer.h).
  std::string buffering = "per hypothesis";
  if (m_buffer) {
    if (opts->search.algo != Normal && opts->search.algo != CubePruning) {
      buffering = "per hypothesis (buffer= needs -search-algorithm 0 or 1)";
    } else if (opts->search.algo == Normal && opts->search.UseEarlyDiscarding()) {
      buffering = "per hypothesis (buffer= is off with early discarding)";
    } else {
      CSLMBuffer::Register(this);
      std::ostringstream b;
      b << "buffered, " << m_buffer << " n-grams per request";
      if (opts->search.algo == CubePruning && m_predict > 0) {
        b << ", cube pruning asking before each stack for what its search creates run ahead for " << m_predict
          << "x its pop limit (";
        if (m_evaluateRunAhead)
          b << "every feature evaluated, " << m_rounds << " rounds";
        else
          b << "estimated scores";
        b << "), a cube's reach grown from " << m_corner << " by " << m_ahead << "x past a miss";
      } else if (opts->search.algo == CubePruning) {
        b << ", cube pruning asking ahead " << m_corner << " expansions of a new cube, its reach grown "
          << m_ahead << "x past a miss";
      }
      buffering = b.str();
    }
  }
  UTIL_THROW_IF2(m_buffer && (m_corner < 1 || m_ahead < 1), who << ": corner= and ahead= must be at least 1");
  m_opt.cache_size = m_opt.CacheSize(m_port == -1, self_normalized, m_buffer);
  std::cerr << who << ": CSLM " << where << ", order " << m_order << ", vocabulary " << facts.words.size() << model
            << ", scoring " << buffering << (m_opt.future_cost ? ", in the future-cost estimate" : "")
            << ", n-gram cache " << m_opt.cache_size << " per thread" << std::endl;
}

CSLM::ThreadData& CSLM::ThisThread() const {
  ThreadData* td = m_local.get();
  if (!td) {
    td = new ThreadData(m_backend->NewSession(), m_opt.cache_size, m_vocab, m_unk);
    m_local.reset(td);
  }
  return *td;
}

const FFState* CSLM::EmptyHypothesisState(const InputType& /*input*/) const {
  return new CSLMState(std::vector<uint32_t>(1, m_bos));
}

void CSLM::PhraseIds(ThreadData& td, const Phrase& phrase, std::vector<uint32_t>* ids) const {
  td.ids.Phrase(phrase, m_opt.factor, ids);
}

void CSLM::Score(ThreadData& td, const std::vector<uint32_t>& ngrams, size_t count,
                 std::vector<float>* logprobs) const {
  ScoreThroughCache(GetScoreProducerDescription(), &td.cache, td.session.get(), ngrams, m_order, count, logprobs,
                    &td.hits);
}

void CSLM::Evaluate(ThreadData& td, const uint32_t* ngrams, size_t count, float* logprobs, uint8_t* flags) const {
  try {
    td.session->Evaluate(ngrams, count, logprobs, flags);
  } catch (const std::exception& e) {
    Fatal(std::string(e.what()) + "; stopping the decoder");
  }
}

void CSLM::EvaluateInIsolation(const Phrase& /*source*/, const TargetPhrase& targetPhrase,
                               ScoreComponentCollection& scoreBreakdown,
                               ScoreComponentCollection& estimatedScores) const {
  if (m_opt.future_cost != 1) return;
  ThreadData& td = ThisThread();
  std::vector<uint32_t> ids, ngrams;
  PhraseIds(td, targetPhrase, &ids);
  const size_t internal = cslm::internal_ngrams(ids, m_order, m_bos, &ngrams);
  const size_t estimate = cslm::estimate_ngrams(ids, m_order, m_bos, &ngrams);
  std::vector<float> lp;
  if (internal + estimate) Score(td, ngrams, internal + estimate, &lp);
  AddPhraseScores(*this, lp, internal, estimate, ids, m_unk, &scoreBreakdown, &estimatedScores);
}

void CSLM::EvaluateTranslationOptionListWithSourceContext(const InputType& /*input*/,
                                                          const TranslationOptionList& list) const {
  if (m_opt.future_cost == 1) return;  // scored in EvaluateInIsolation
  // Moses computes an option's future-cost estimate before this call (and
  // keeps its own copy), so only real scores are added here: the n-grams whose
  // history lies inside the phrase, and the unknown-word count. The first
  // order-1 words are scored when the option is applied to a hypothesis.
  ThreadData& td = ThisThread();
  std::vector<uint32_t> ids, ngrams;
  std::vector<size_t> internal_count;
  std::vector<float> unknown;
  for (TranslationOptionList::const_iterator it = list.begin(); it != list.end(); ++it) {
    PhraseIds(td, (*it)->GetTargetPhrase(), &ids);
    internal_count.push_back(cslm::internal_ngrams(ids, m_order, m_bos, &ngrams));
    unknown.push_back(static_cast<float>(CountUnknown(ids, m_unk)));
  }
  std::vector<float> lp;
  Score(td, ngrams, ngrams.size() / m_order, &lp);  // the whole list in one request

  size_t pos = 0, j = 0;
  std::vector<float> scores(m_numScoreComponents, 0.0f);
  for (TranslationOptionList::const_iterator it = list.begin(); it != list.end(); ++it, ++j) {
    float sum = 0.0f;
    for (size_t k = 0; k < internal_count[j]; ++k) sum += lp[pos++];
    scores[0] = sum;
    if (m_numScoreComponents > 1) scores[1] = unknown[j];
    TranslationOption& opt = **it;
    opt.GetScoreBreakdown().PlusEquals(this, scores);
    opt.UpdateScore();
  }
}

bool CSLM::Cached(ThreadData& td, const std::vector<uint32_t>& ngrams, size_t count,
                  std::vector<float>* logprobs) const {
  logprobs->resize(count);
  uint8_t flags;
  for (size_t i = 0; i < count; ++i)
    if (!td.cache.find(&ngrams[i * m_order], m_order, &(*logprobs)[i], &flags)) return false;
  td.hits += count;
  return true;
}

void CSLM::AddPrefetch(ThreadData& td, const Hypothesis& hypo, const CSLMState& state,
                       std::vector<uint32_t>* ngrams) const {
  // Cube pruning goes on to combine this predecessor with the next options of
  // the same source span (the list is sorted best first): their boundary
  // n-grams have the same history and ride along in this request, so that
  // those expansions find them in the cache instead of making round trips.
  const TranslationOptionList* list =
      hypo.GetManager().getSntTranslationOptions()->GetTranslationOptionList(hypo.GetCurrSourceWordsRange());
  if (!list) return;
  const TranslationOption* mine = &hypo.GetTranslationOption();
  const bool complete = hypo.IsSourceCompleted();  // the same for every option of this span
  std::vector<uint32_t> ids, next;
  size_t taken = 0;
  for (TranslationOptionList::const_iterator it = list->begin(); it != list->end() && taken < m_prefetch; ++it) {
    if (*it == mine) continue;
    PhraseIds(td, (*it)->GetTargetPhrase(), &ids);
    cslm::boundary_ngrams(state.Words(), state.Size(), ids, complete, m_order, m_bos, m_eos, ngrams, &next);
    ++taken;
  }
}

FFState* CSLM::EvaluateWhenApplied(const Hypothesis& hypo, const FFState* prev_state,
                                   ScoreComponentCollection* accumulator) const {
  ThreadData& td = ThisThread();
  const CSLMState& prev = static_cast<const CSLMState&>(*prev_state);
  std::vector<uint32_t>& ngrams = td.ngrams;
  std::vector<float>& lp = td.lp;
  ngrams.clear();
  PhraseIds(td, hypo.GetCurrTargetPhrase(), &td.phrase_ids);
  const size_t count = cslm::boundary_ngrams(prev.Words(), prev.Size(), td.phrase_ids, hypo.IsSourceCompleted(),
                                             m_order, m_bos, m_eos, &ngrams, &td.next);
  if (count) {
    float sum = 0.0f;
    if (td.run_ahead) {  // the buffer's run ahead (CSLMBuffer.cpp): nothing asked
      sum = RunAheadSum(td, ngrams, count);
    } else {
      if (!Cached(td, ngrams, count, &lp)) {
        // A round trip is due: fill it with the likely next questions.
        if (m_prefetch && !m_buffer) AddPrefetch(td, hypo, prev, &ngrams);
        Score(td, ngrams, ngrams.size() / m_order, &lp);  // the first `count` values are this hypothesis's
      }
      for (size_t i = 0; i < count; ++i) sum += lp[i];
    }
    td.scores.assign(m_numScoreComponents, 0.0f);
    td.scores[0] = sum;
    accumulator->PlusEquals(this, td.scores);
  }
  return new CSLMState(td.next);
}

float CSLM::RunAheadSum(ThreadData& td, const std::vector<uint32_t>& ngrams, size_t count) const {
  float sum = 0.0f;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t* g = &ngrams[i * m_order];
    float v;
    uint8_t fl;
    const cslm::NgramCache::Mark m = td.cache.mark(g, m_order, &v, &fl);
    if (m == cslm::NgramCache::kAnswered) {
      sum += v;
    } else {
      // before the thread's first answer, -5: a guess that only orders the first stack's first round
      sum += td.provisional.estimate(g, m_order, -5.0f);
      ++td.run_ahead_misses;
      if (m == cslm::NgramCache::kMarked) td.queued.insert(td.queued.end(), g, g + m_order);
    }
  }
  return sum;
}

size_t CSLM::QueueNgrams(ThreadData& td, const CSLMState& state, const Phrase& phrase,
                         bool complete) const {
  std::vector<uint32_t>& ids = td.queue_ids;
  std::vector<uint32_t>& ngrams = td.queue_ngrams;
  ngrams.clear();
  PhraseIds(td, phrase, &ids);
  const size_t count =
      cslm::boundary_ngrams(state.Words(), state.Size(), ids, complete, m_order, m_bos, m_eos, &ngrams, &td.queue_next);
  for (size_t i = 0; i < count; ++i) QueueOne(td, &ngrams[i * m_order]);
  return td.queued.size() / m_order;
}

void CSLM::QueueOne(ThreadData& td, const uint32_t* ngram) const {
  float lp;
  uint8_t fl;
  if (td.cache.mark(ngram, m_order, &lp, &fl) == cslm::NgramCache::kMarked)
    td.queued.insert(td.queued.end(), ngram, ngram + m_order);
}

size_t CSLM::Queue(const Hypothesis& hypo) const {
  const CSLMState& prev = static_cast<const CSLMState&>(*hypo.GetPrevHypo()->GetFFState(m_stateIndex));
  return QueueNgrams(ThisThread(), prev, hypo.GetCurrTargetPhrase(), hypo.IsSourceCompleted());
}

size_t CSLM::QueueExpansion(const Hypothesis& prev, const TranslationOption& option, bool complete) const {
  const CSLMState& state = static_cast<const CSLMState&>(*prev.GetFFState(m_stateIndex));
  return QueueNgrams(ThisThread(), state, option.GetTargetPhrase(), complete);
}

size_t CSLM::Queued() const { return ThisThread().queued.size() / m_order; }

void CSLM::RunAhead(bool on) const { ThisThread().run_ahead = on; }

size_t CSLM::RunAheadMisses() const { return ThisThread().run_ahead_misses; }

void CSLM::ScoreQueued() const {
  ThreadData& td = ThisThread();
  const size_t count = td.queued.size() / m_order;
  td.cache.make_room(count);  // every value stays until the held hypotheses are evaluated (answers pending entries)
  std::vector<float>& lp = td.lp;
  std::vector<uint8_t>& fl = td.flags;
  for (size_t at = 0; at < count; at += m_buffer) {
    const size_t n = std::min(m_buffer, count - at);
    lp.resize(n);
    fl.resize(n);
    Evaluate(td, &td.queued[at * m_order], n, &lp[0], &fl[0]);
    for (size_t k = 0; k < n; ++k) td.cache.insert(&td.queued[(at + k) * m_order], m_order, lp[k], fl[k]);
    for (size_t k = 0; k < n; ++k) td.provisional.add(&td.queued[(at + k) * m_order], m_order, lp[k]);
  }
  td.queued.clear();
}

void CSLM::CleanUpAfterSentenceProcessing(const InputType& source) {
  ThreadData& td = ThisThread();
  if (m_buffer) CSLMBuffer::EndSentence();
  EndSentence(GetScoreProducerDescription(), source.GetTranslationId(), m_opt.stats, "n-grams", td.session.get(),
              &td.cache, &td.hits, m_buffer > 0);
}

FFState* CSLM::EvaluateWhenApplied(const ChartHypothesis& /*hypo*/, int /*featureID*/,
                                   ScoreComponentCollection* /*accumulator*/) const {
  UTIL_THROW2(GetScoreProducerDescription() << ": the CSLM feature supports phrase-based decoding only");
}

}  // namespace Moses
