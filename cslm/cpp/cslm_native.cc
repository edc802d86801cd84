// cslm_native.cc -- a C interface to cslm::LocalModel, for Python (cslm/native.py,
// through ctypes): `cslm serve --self-normalized` on a CPU scores with the same
// evaluator as Moses's in-process mode (premultiplied first layer, one output row
// per n-gram, a cache of last hidden layers by history).
//
// Built by `pip install` as the module file cslm/_native*.so (setup.py); it has
// no Python entry point and links against nothing but the C++ runtime.
//
//   char err[512];
//   void* m = cslm_native_open("/models/cslm", 16384, "fp32", err, sizeof err);  // 0 on failure, err says why
//   cslm_native_score(m, rows, count, 0, logprobs, 2, err, sizeof err);  // 2 threads; 0, or -1 and err
//   cslm_native_close(m);
//
// A call of many rows is scored by the caller's thread and up to `threads` - 1
// helper threads (one per 0.1 ms of the rows' work, as the last calls were
// timed), kept waiting between calls. They take the rows a few at a time (at
// most kChunkRows, four chunks a thread at least, and fewer as the call's end
// nears) as each is free, not in fixed shares: on cores the decoder also
// uses, a thread that gets no core for a while takes fewer rows, and the
// caller never waits for a helper that has taken none.
// Calls may come from several threads at once. Every thread has a working
// memory of its own (LocalModel::Scratch), and all share one cache of last
// hidden layers (SharedHiddenCache), so that a history one thread computed is
// found by all.
#include <string.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cslm_local.h"

namespace {

// Rows per thread past which a larger call is no cheaper per row (what
// cslm_native_facts tells the server's batcher); before any call has been
// timed, also the fewest rows worth a helper thread.
const size_t kRowsPerThread = 256;
// The least work worth a helper thread, in nanoseconds: waking one costs some
// microseconds. A call gets one thread per this much of its rows' time.
const uint64_t kHelperNs = 100000;
// Rows a thread takes at once: small enough that the caller, once the rows
// are all taken, waits at most this many for a helper that has some. A call
// of few rows is cut finer (four chunks a thread), so that the caller works
// on while a helper wakes.
const size_t kChunkRows = 64;

// One cslm_native_score call: its rows, taken a chunk at a time (cslm_native_plan).
struct Call {
  const uint32_t* rows;
  size_t count;
  unsigned width;
  bool normalized;
  float* logprobs;
  size_t chunk;              // rows a thread takes at once: at most kChunkRows, or all of them with no helper
  size_t threads;            // threads asked to score it, the caller's among them
  std::atomic<size_t> next;  // the first row no thread has taken
  std::atomic<size_t> done;  // rows scored (or failed)
  std::mutex mutex;
  std::condition_variable finished;
  std::string error;  // the first error a chunk met
};

struct Native {
  Native(const char* dir, size_t slots, cslm::Precision precision)
      : model(dir, precision),
        cache(slots ? new cslm::SharedHiddenCache(slots, model.row_size() - 1, model.hidden_size()) : 0),
        stopping(false), hits(0), misses(0), row_ns(0) {}
  ~Native() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    for (size_t i = 0; i < helpers.size(); ++i) helpers[i].join();
    for (size_t i = 0; i < scratches.size(); ++i) delete scratches[i];
  }
  cslm::LocalModel model;
  std::unique_ptr<cslm::SharedHiddenCache> cache;  // 0: no history cache

  std::mutex mutex;  // guards what follows
  std::vector<cslm::LocalModel::Scratch*> scratches, idle;  // every caller's scratch, and those no call holds
  std::vector<std::thread> helpers;
  std::deque<std::shared_ptr<Call> > waiting;  // one entry per helper a call asked for
  std::condition_variable wake;
  bool stopping;

  std::atomic<size_t> hits, misses;  // the history cache's lookups, counted as each chunk is done
  // A row's scoring time in ns, averaged over the last chunks (cache hits
  // and all); 0 before the first. Updated without a lock: a lost update
  // only delays the average.
  std::atomic<uint64_t> row_ns;

  cslm::LocalModel::Scratch* NewScratch() {
    cslm::LocalModel::Scratch* s = new cslm::LocalModel::Scratch(0);
    s->shared = cache.get();
    return s;
  }
  cslm::LocalModel::Scratch* Take() {
    std::lock_guard<std::mutex> lock(mutex);
    if (idle.empty()) {
      scratches.push_back(NewScratch());
      return scratches.back();
    }
    cslm::LocalModel::Scratch* s = idle.back();
    idle.pop_back();
    return s;
  }
  void Give(cslm::LocalModel::Scratch* s) {
    std::lock_guard<std::mutex> lock(mutex);
    idle.push_back(s);
  }

  // Takes the next rows of `call` for this thread, [*begin, *end); false when
  // none is left. A chunk at most, and no more than what is left shared out
  // over twice the call's threads: the last chunks are a few rows, so that
  // the threads finish together instead of one scoring a whole chunk alone.
  static bool NextRows(Call* call, size_t* begin, size_t* end) {
    size_t b = call->next.load();
    for (;;) {
      if (b >= call->count) return false;
      const size_t left = call->count - b, fair = left / (2 * call->threads);
      const size_t take = call->threads < 2 ? left : fair < 1 ? 1 : fair < call->chunk ? fair : call->chunk;
      if (call->next.compare_exchange_weak(b, b + take)) {
        *begin = b;
        *end = b + take;
        return true;
      }
    }
  }

  // Scores chunks of `call` until none is left untaken.
  void Work(Call* call, cslm::LocalModel::Scratch* s) {
    size_t begin, end;
    while (NextRows(call, &begin, &end)) {
      const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
      try {
        model.Score(call->rows + begin * call->width, end - begin, call->normalized, call->logprobs + begin, s);
        const uint64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - t0).count() / (end - begin);
        const uint64_t old = row_ns.load(std::memory_order_relaxed);
        row_ns.store(old ? (7 * old + ns) / 8 : ns, std::memory_order_relaxed);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(call->mutex);
        if (call->error.empty()) call->error = e.what();
      }
      hits += s->hits;
      misses += s->misses;
      s->hits = s->misses = 0;
      if (call->done.fetch_add(end - begin) + (end - begin) == call->count) {
        std::lock_guard<std::mutex> lock(call->mutex);
        call->finished.notify_all();
      }
    }
  }

  // A helper thread: waits for a call that asked for one, and helps with it.
  void Help() {
    std::unique_ptr<cslm::LocalModel::Scratch> s(NewScratch());
    for (;;) {
      std::shared_ptr<Call> call;  // kept alive while this thread holds it, whenever its caller returns
      {
        std::unique_lock<std::mutex> lock(mutex);
        while (!stopping && waiting.empty()) wake.wait(lock);
        if (stopping) return;
        call = waiting.front();
        waiting.pop_front();
      }
      Work(call.get(), s.get());
    }
  }

  // Asks for `wanted` helpers for `call`, starting threads as needed; returns how many were asked.
  size_t Ask(const std::shared_ptr<Call>& call, size_t wanted) {
    std::lock_guard<std::mutex> lock(mutex);
    while (helpers.size() < wanted) {
      try {
        helpers.push_back(std::thread(&Native::Help, this));
      } catch (const std::exception&) {  // no thread to be had: fewer helpers
        wanted = helpers.size();
      }
    }
    for (size_t k = 0; k < wanted; ++k) waiting.push_back(call);
    return wanted;
  }

  // Takes back the requests for help no helper has picked up yet.
  void Withdraw(const std::shared_ptr<Call>& call) {
    std::lock_guard<std::mutex> lock(mutex);
    for (std::deque<std::shared_ptr<Call> >::iterator it = waiting.begin(); it != waiting.end();)
      it = *it == call ? waiting.erase(it) : it + 1;
  }
};

void Say(const char* what, char* err, size_t size) {
  if (!err || !size) return;
  strncpy(err, what, size - 1);
  err[size - 1] = '\0';
}

}  // namespace

extern "C" {

// Loads MODEL_DIR in `precision` ("fp32" or "int8": cslm_local.h, "Precision");
// `history_slots` rows of hidden-layer cache, shared by the threads that score
// (0: none). Returns a handle, or 0 with the reason ("FILE: reason") in err.
void* cslm_native_open(const char* model_dir, size_t history_slots, const char* precision, char* err,
                       size_t err_size) {
  try {
    cslm::Precision p;
    if (!cslm::ParsePrecision(precision, &p)) {
      Say((std::string("precision ") + precision + ": not fp32 or int8").c_str(), err, err_size);
      return 0;
    }
    return new Native(model_dir, history_slots, p);
  } catch (const std::exception& e) {
    Say(e.what(), err, err_size);
  } catch (...) {
    Say("cannot load the model", err, err_size);
  }
  return 0;
}

// The vector instructions the evaluator's kernels use here (cslm_local.h,
// LocalModel::Kernels), or 0 with the reason in err (a CSLM_KERNELS it refuses).
const char* cslm_native_kernels(char* err, size_t err_size) {
  try {
    return cslm::LocalModel::Kernels();
  } catch (const std::exception& e) {
    Say(e.what(), err, err_size);
  }
  return 0;
}

// What the model is: ids per row (order + source window) and the vocabulary's
// size; and the rows per thread past which a call is no cheaper per row
// (kRowsPerThread).
void cslm_native_facts(void* handle, unsigned* row_size, size_t* vocab_size, size_t* rows_per_thread) {
  const cslm::LocalModel& m = static_cast<Native*>(handle)->model;
  *row_size = m.row_size();
  *vocab_size = m.vocab_size();
  *rows_per_thread = kRowsPerThread;
}

// How a call of `count` rows is shared out, where a row has taken `row_ns`
// (0: not timed yet) and `threads` may score: *wanted threads in all, the
// caller's among them (one per kHelperNs of the rows' expected time, or per
// kRowsPerThread rows untimed; at most `threads` and `count`), each taking
// *chunk rows at a time (all of them on one thread; else at most kChunkRows
// and at least 1, four chunks a thread where the rows allow).
void cslm_native_plan(size_t count, uint64_t row_ns, unsigned threads, size_t* wanted, size_t* chunk) {
  size_t w = row_ns ? static_cast<size_t>(count * row_ns / kHelperNs) : count / kRowsPerThread;
  if (w > threads) w = threads;
  if (w > count) w = count;
  const size_t share = count / (4 * (w ? w : 1));
  *wanted = w;
  *chunk = w < 2 ? count : share < 1 ? 1 : share < kChunkRows ? share : kChunkRows;
}

// Scores `count` rows of row_size() uint32 ids (history oldest first, the
// predicted word last) into logprobs: o_w - ln Z if `normalized`, else o_w; on
// up to `threads` threads (0 or 1: the caller's alone). Returns 0, or -1 with
// the reason in err (an id outside the vocabulary).
int cslm_native_score(void* handle, const uint32_t* rows, size_t count, int normalized, float* logprobs,
                      unsigned threads, char* err, size_t err_size) {
  Native* n = static_cast<Native*>(handle);
  std::shared_ptr<Call> call(new Call);
  call->rows = rows;
  call->count = count;
  call->width = n->model.row_size();
  call->normalized = normalized != 0;
  call->logprobs = logprobs;
  call->next = 0;
  call->done = 0;
  size_t wanted;
  cslm_native_plan(count, n->row_ns.load(std::memory_order_relaxed), threads, &wanted, &call->chunk);
  call->threads = wanted > 1 ? wanted : 1;
  const size_t asked = wanted > 1 ? n->Ask(call, wanted - 1) : 0;
  for (size_t k = 0; k < asked; ++k) n->wake.notify_one();
  cslm::LocalModel::Scratch* s = n->Take();
  n->Work(call.get(), s);
  n->Give(s);
  if (asked) {
    n->Withdraw(call);
    std::unique_lock<std::mutex> lock(call->mutex);  // a helper may still score a chunk it took
    while (call->done.load() < count) call->finished.wait(lock);
  }
  if (!call->error.empty()) {
    Say(call->error.c_str(), err, err_size);
    return -1;
  }
  return 0;
}

// Hidden-layer cache lookups of the calls returned so far: found and computed.
void cslm_native_cache_counts(void* handle, size_t* hits, size_t* misses) {
  Native* n = static_cast<Native*>(handle);
  *hits = n->hits.load();
  *misses = n->misses.load();
}

void cslm_native_close(void* handle) { delete static_cast<Native*>(handle); }

}  // extern "C"
