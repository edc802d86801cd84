// CSLMShared.cpp -- see CSLMShared.h.
#include "CSLMShared.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "moses/FF/FeatureFunction.h"
#include "moses/Factor.h"
#include "moses/Phrase.h"
#include "moses/ScoreComponentCollection.h"
#include "moses/Util.h"
#include "moses/Word.h"
#include "util/exception.hh"

namespace Moses {

bool CSLMOptions::Set(const std::string& who, const std::string& key, const std::string& value) {
  if (key == "path") {
    path = value;
  } else if (key == "order") {
    order = ScanNumber<unsigned>(who, key, value, 0, 64);
  } else if (key == "factor") {
    factor = ScanNumber<FactorType>(who, key, value, 0, MAX_NUM_FACTORS - 1);
  } else if (key == "cache-size") {
    cache_size = ScanNumber<size_t>(who, key, value, 0, 100000000);
  } else if (key == "floor") {
    floor = ScanNumber<float>(who, key, value, -1e6f, 0.0f);
  } else if (key == "history-cache") {
    history_cache = ScanNumber<size_t>(who, key, value, 0, 10000000);
  } else if (key == "future-cost") {
    future_cost = Scan<bool>(value) ? 1 : 0;
  } else if (key == "stats") {
    stats = Scan<bool>(value);
  } else if (key == "precision") {
    UTIL_THROW_IF2(!cslm::ParsePrecision(value, &precision), who << ": precision= must be fp32 or int8");
  } else if (key == "self-normalized") {
    UTIL_THROW_IF2(value != "auto" && value != "true" && value != "false",
                   who << ": self-normalized= must be auto, true or false");
    self_norm = value == "auto" ? -1 : value == "true";
  } else {
    return false;
  }
  return true;
}

const size_t CSLMOptions::kCacheSizeAuto;

size_t CSLMOptions::CacheSize(bool in_process, bool self_normalized, size_t buffer) const {
  return cache_size != kCacheSizeAuto ? cache_size
                                      : cslm::default_cache_size(in_process, self_normalized, history_cache, buffer);
}

void CSLMFatal(const std::string& who, const std::string& message) {
  std::cerr << "\n" << who << ": " << message << std::endl;
  std::cout.flush();
  std::fflush(stdout);
  _exit(1);
}

const uint32_t FactorIds::kUnset;

uint32_t FactorIds::Id(const Factor* factor) {
  if (!factor) return unk_;
  const size_t key = factor->GetId();
  if (key >= memo_.size()) memo_.resize(key + 1, kUnset);
  uint32_t& id = memo_[key];
  if (id == kUnset) {
    boost::unordered_map<std::string, uint32_t>::const_iterator v = vocab_.find(factor->GetString().as_string());
    id = v != vocab_.end() ? v->second : unk_;
  }
  return id;
}

void FactorIds::Phrase(const Moses::Phrase& phrase, FactorType factor_type, std::vector<uint32_t>* ids) {
  ids->clear();
  for (size_t i = 0; i < phrase.GetSize(); ++i) ids->push_back(Id(phrase.GetWord(i).GetFactor(factor_type)));
}

size_t CountUnknown(const std::vector<uint32_t>& ids, uint32_t unk) {
  size_t n = 0;
  for (size_t i = 0; i < ids.size(); ++i) n += ids[i] == unk;
  return n;
}

void AddPhraseScores(const FeatureFunction& ff, const std::vector<float>& lp, size_t internal, size_t estimate,
                     const std::vector<uint32_t>& ids, uint32_t unk, ScoreComponentCollection* scores,
                     ScoreComponentCollection* estimated) {
  const size_t components = ff.GetNumScoreComponents();
  std::vector<float> real(components, 0.0f), future(components, 0.0f);
  for (size_t k = 0; k < internal; ++k) real[0] += lp[k];
  for (size_t k = internal; k < internal + estimate; ++k) future[0] += lp[k];
  if (components > 1) real[1] = static_cast<float>(CountUnknown(ids, unk));
  scores->PlusEquals(&ff, real);
  if (estimate && estimated) estimated->PlusEquals(&ff, future);
}

void ScoreThroughCache(const std::string& who, cslm::NgramCache* cache, cslm::Backend::Session* session,
                       const std::vector<uint32_t>& rows, unsigned width, size_t count, std::vector<float>* logprobs,
                       size_t* hits) {
  logprobs->assign(count, 0.0f);
  std::vector<uint32_t> missing;
  std::vector<size_t> where;
  for (size_t i = 0; i < count; ++i) {
    uint8_t flags;
    if (!cache->find(&rows[i * width], width, &(*logprobs)[i], &flags)) {
      missing.insert(missing.end(), rows.begin() + i * width, rows.begin() + (i + 1) * width);
      where.push_back(i);
    }
  }
  *hits += count - where.size();
  if (where.empty()) return;
  std::vector<float> lp(where.size());
  std::vector<uint8_t> fl(where.size());
  try {
    session->Evaluate(&missing[0], where.size(), &lp[0], &fl[0]);
  } catch (const std::exception& e) {
    CSLMFatal(who, std::string(e.what()) + "; stopping the decoder");
  }
  for (size_t k = 0; k < where.size(); ++k) {
    (*logprobs)[where[k]] = lp[k];
    cache->insert(&missing[k * width], width, lp[k], fl[k]);
  }
}

void EndSentence(const std::string& who, long sentence, bool stats, const char* rows, cslm::Backend::Session* session,
                 cslm::NgramCache* cache, size_t* hits, bool forget) {
  if (stats)
    std::cerr << who << ": sentence " << sentence << ": requests " << session->requests << ", " << rows
              << " evaluated " << session->evaluated << ", cache hits " << *hits << ", hidden layers computed "
              << session->HiddenComputed() << std::endl;
  session->ResetCounters();
  *hits = 0;
  if (forget)
    cache->clear();
  else
    cache->make_room(cache->capacity() / 2);
}

}  // namespace Moses
