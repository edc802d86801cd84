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
//   cslm_native_score(m, rows, count, 0, logprobs, 2, err, sizeof err);  // 2 threads; 0, or -1 and err
//   cslm_native_close(m);
//
// A call of many rows splits them over up to `threads` threads (contiguous
// parts of at least kRowsPerThread rows), the first on the caller's. Calls may
// come from several threads at once. Each part takes a working memory
// (LocalModel::Scratch, with its own history cache) from a pool, so a part never
// waits for another, and the pool holds as many as were ever in use at once.
#include <string.h>

#include <exception>
#include <mutex>
#include <string>
#include <thread>
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
  size_t hits = 0, misses = 0;  // the history caches' lookups, counted as each part gives its scratch back

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

// Below this many rows a part's thread costs more than it saves.
const size_t kRowsPerThread = 256;

// Scores one part with a scratch of the pool; "" or what went wrong.
std::string ScorePart(Native* n, const uint32_t* rows, size_t count, bool normalized, float* logprobs) {
  cslm::LocalModel::Scratch* s = n->Take();
  std::string error;
  try {
    if (count) n->model.Score(rows, count, normalized, logprobs, s);
  } catch (const std::exception& e) {
    error = e.what();
  }
  n->Give(s);
  return error;
}

void Say(const char* what, char* err, size_t size) {
  if (!err || !size) return;
  strncpy(err, what, size - 1);
  err[size - 1] = '\0';
}

}  // namespace

extern "C" {

// Loads MODEL_DIR; `history_slots` rows of hidden-layer cache per part scored
// at once (0: none). Returns a handle, or 0 with the reason ("FILE: reason") in err.
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

// What the model is: ids per row (order + source window) and the vocabulary's
// size; and the fewest rows a call gives each thread (kRowsPerThread).
void cslm_native_facts(void* handle, unsigned* row_size, size_t* vocab_size, size_t* rows_per_thread) {
  const cslm::LocalModel& m = static_cast<Native*>(handle)->model;
  *row_size = m.row_size();
  *vocab_size = m.vocab_size();
  *rows_per_thread = kRowsPerThread;
}

// Scores `count` rows of row_size() uint32 ids (history oldest first, the
// predicted word last) into logprobs: o_w - ln Z if `normalized`, else o_w; on
// up to `threads` threads (0 or 1: the caller's alone). Returns 0, or -1 with
// the reason in err (an id outside the vocabulary).
int cslm_native_score(void* handle, const uint32_t* rows, size_t count, int normalized, float* logprobs,
                      unsigned threads, char* err, size_t err_size) {
  Native* n = static_cast<Native*>(handle);
  const unsigned width = n->model.row_size();
  size_t parts = count / kRowsPerThread;
  if (parts > threads) parts = threads;
  if (parts < 1) parts = 1;
  const size_t per = (count + parts - 1) / parts;
  std::vector<std::string> errors(parts);
  std::vector<std::thread> helpers;
  for (size_t k = 1; k < parts; ++k) {
    const size_t begin = k * per, end = begin + per < count ? begin + per : count;
    try {
      helpers.push_back(std::thread([=, &errors]() {
        errors[k] = ScorePart(n, rows + begin * width, end - begin, normalized != 0, logprobs + begin);
      }));
    } catch (const std::exception&) {  // no thread to be had: this part on the caller's
      errors[k] = ScorePart(n, rows + begin * width, end - begin, normalized != 0, logprobs + begin);
    }
  }
  errors[0] = ScorePart(n, rows, per < count ? per : count, normalized != 0, logprobs);
  for (size_t i = 0; i < helpers.size(); ++i) helpers[i].join();
  for (size_t k = 0; k < parts; ++k) {
    if (!errors[k].empty()) {
      Say(errors[k].c_str(), err, err_size);
      return -1;
    }
  }
  return 0;
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
