// cslm_native.cc -- a C interface to cslm::LocalModel, for Python (cslm/native.py,
// through ctypes): `cslm serve --self-normalized` on a CPU scores with the same
// evaluator as Moses's in-process mode (premultiplied first layer, one output row
// per n-gram, a cache of last hidden layers by history).
//
// Built by `pip install` as the module file cslm/_native*.so (setup.py); it has
// no Python entry point and links against nothing but the C++ runtime.
//
//   char err[512];
//   void* m = cslm_native_open("/models/cslm", 16384, err, sizeof err);  // 0 on failure, err says why
//   cslm_native_score(m, rows, count, 0, logprobs, err, sizeof err);     // 0, or -1 and err
//   cslm_native_close(m);
//
// Calls may come from several threads at once: each takes a working memory
// (LocalModel::Scratch, with its own history cache) from a pool, so a call never
// waits for another, and the pool holds as many as were ever in use at once.
#include <string.h>

#include <exception>
#include <mutex>
#include <vector>

#include "cslm_local.h"

namespace {

struct Native {
  Native(const char* dir, size_t slots) : model(dir), history_slots(slots) {}
  ~Native() {
    for (size_t i = 0; i < all.size(); ++i) delete all[i];
  }
  cslm::LocalModel model;
  size_t history_slots;
  std::mutex mutex;
  std::vector<cslm::LocalModel::Scratch*> all, idle;  // every scratch, and those no call holds
  size_t hits = 0, misses = 0;  // the history caches' lookups, counted as each call gives its scratch back

  cslm::LocalModel::Scratch* Take() {
    std::lock_guard<std::mutex> lock(mutex);
    if (idle.empty()) {
      all.push_back(new cslm::LocalModel::Scratch(history_slots));
      return all.back();
    }
    cslm::LocalModel::Scratch* s = idle.back();
    idle.pop_back();
    return s;
  }
  void Give(cslm::LocalModel::Scratch* s) {
    std::lock_guard<std::mutex> lock(mutex);
    hits += s->hits;
    misses += s->misses;
    s->hits = s->misses = 0;
    idle.push_back(s);
  }
};

void Say(const char* what, char* err, size_t size) {
  if (!err || !size) return;
  strncpy(err, what, size - 1);
  err[size - 1] = '\0';
}

}  // namespace

extern "C" {

// Loads MODEL_DIR; `history_slots` rows of hidden-layer cache per concurrent
// call (0: none). Returns a handle, or 0 with the reason ("FILE: reason") in err.
void* cslm_native_open(const char* model_dir, size_t history_slots, char* err, size_t err_size) {
  try {
    return new Native(model_dir, history_slots);
  } catch (const std::exception& e) {
    Say(e.what(), err, err_size);
  } catch (...) {
    Say("cannot load the model", err, err_size);
  }
  return 0;
}

// What the model is: ids per row (order + source window), the vocabulary's size,
// and whether training made it self-normalised (1) or not (0).
void cslm_native_facts(void* handle, unsigned* row_size, size_t* vocab_size, int* self_normalized) {
  const cslm::LocalModel& m = static_cast<Native*>(handle)->model;
  *row_size = m.row_size();
  *vocab_size = m.vocab_size();
  *self_normalized = m.self_normalized() ? 1 : 0;
}

// Scores `count` rows of row_size() uint32 ids (history oldest first, the
// predicted word last) into logprobs: o_w - ln Z if `normalized`, else o_w.
// Returns 0, or -1 with the reason in err (an id outside the vocabulary).
int cslm_native_score(void* handle, const uint32_t* rows, size_t count, int normalized, float* logprobs,
                      char* err, size_t err_size) {
  Native* n = static_cast<Native*>(handle);
  cslm::LocalModel::Scratch* s = n->Take();
  int rc = 0;
  try {
    if (count) n->model.Score(rows, count, normalized != 0, logprobs, s);
  } catch (const std::exception& e) {
    Say(e.what(), err, err_size);
    rc = -1;
  }
  n->Give(s);
  return rc;
}

// Hidden-layer cache lookups of the calls returned so far: found and computed.
void cslm_native_cache_counts(void* handle, size_t* hits, size_t* misses) {
  Native* n = static_cast<Native*>(handle);
  std::lock_guard<std::mutex> lock(n->mutex);
  *hits = n->hits;
  *misses = n->misses;
}

void cslm_native_close(void* handle) { delete static_cast<Native*>(handle); }

}  // extern "C"
