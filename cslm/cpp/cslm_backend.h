// cslm_backend.h -- where a decoder's CSLM n-grams are evaluated: in its own
// process (LocalModel) or by a `cslm serve` server (Client). The Moses feature
// (cslm/moses/CSLM.cpp) holds one Backend and one Session per decoder thread,
// and never asks which kind it has. No dependency beyond C++11 and POSIX.
//
//   boost::scoped_ptr<cslm::Backend> b(new cslm::LocalBackend("/models/cslm", -1, 16384, -100.0f));
//   boost::scoped_ptr<cslm::Backend::Session> s(b->NewSession());    // per thread
//   s->Evaluate(ngrams, count, logprobs, flags);                       // order() ids per n-gram
//
// Constructors throw std::runtime_error naming the model file or the server;
// Session::Evaluate throws cslm::Error when no answer can be had (the server
// refused the request, or stayed unreachable through every retry): the caller
// stops, as no score can stand in for a missing one.
#ifndef CSLM_BACKEND_H_
#define CSLM_BACKEND_H_

#include <stddef.h>
#include <stdint.h>

#include <iosfwd>
#include <string>
#include <vector>

#include "cslm_client.h"
#include "cslm_local.h"

namespace cslm {

// What the feature needs to know of the model, whoever evaluates it.
struct ModelFacts {
  ModelFacts() : order(0), source_window(0), bos(0), eos(0), unk(0), source_bos(0), source_eos(0), source_unk(0) {}
  unsigned order;                  // n: every n-gram has order() ids, oldest first
  unsigned source_window;          // m: a joint model's source words per row (0: a plain CSLM)
  uint32_t bos, eos, unk;          // <s>, </s>, [UNK]
  uint32_t source_bos, source_eos, source_unk;  // the same in a joint model's source shortlist
  std::vector<std::string> words;  // the shortlist, index = id
  std::vector<std::string> source_words;  // a joint model's source shortlist (cslm.src.vocab), index = id
};

class Backend {
 public:
  // One decoder thread's working memory or connection. Not shared between threads.
  class Session {
   public:
    explicit Session(float floor) : requests(0), evaluated(0), floor_(floor) {}
    virtual ~Session() {}

    // Scores `count` n-grams (order ids each, oldest first, predicted word
    // last; a joint model's rows: order + source_window ids, cslm_local.h) into logprobs[0..count), each at least the backend's floor (NaN
    // and -inf become the floor too), and ScoreFlags into flags[0..count).
    // Throws cslm::Error when the backend cannot answer.
    void Evaluate(const uint32_t* ngrams, size_t count, float* logprobs, uint8_t* flags);

    // Hidden layers computed since the last ResetCounters (in process; 0 for a server).
    virtual size_t HiddenComputed() const { return 0; }
    // Zeroes requests, evaluated and HiddenComputed (per sentence, for stats=1).
    virtual void ResetCounters() { requests = evaluated = 0; }

    size_t requests;   // round trips to a server
    size_t evaluated;  // n-grams evaluated

   protected:
    // The backend's own evaluation: Evaluate's contract without the floor.
    virtual void Compute(const uint32_t* ngrams, size_t count, float* logprobs, uint8_t* flags) = 0;

   private:
    Session(const Session&);
    Session& operator=(const Session&);
    float floor_;
  };

  virtual ~Backend() {}
  const ModelFacts& facts() const { return facts_; }
  // A new session for the calling thread; the caller owns it.
  virtual Session* NewSession() const = 0;
  // Where the model is evaluated, for the decoder's log: "DIR (in process)" or "HOST:PORT".
  virtual std::string Where() const = 0;

 protected:
  Backend() {}
  ModelFacts facts_;

 private:
  Backend(const Backend&);
  Backend& operator=(const Backend&);
};

// The model directory's network in this process, with premultiplied first-layer
// tables and a per-session cache of hidden layers (cslm_local.h).
class LocalBackend : public Backend {
 public:
  // self_normalized: 1 asks for o_w alone, 0 for the exact softmax, -1 as the
  // model was trained. history_slots: hidden layers cached per session.
  // precision: the layers after the first in float32 or 8 bits (cslm_local.h).
  LocalBackend(const std::string& model_dir, int self_normalized, size_t history_slots, float floor,
               Precision precision = kFloat32);

  Session* NewSession() const;
  std::string Where() const { return dir_ + " (in process)"; }
  const LocalModel& model() const { return model_; }
  // True if Evaluate returns o_w alone (self-normalised), false for the exact softmax.
  bool self_normalized() const { return self_normalized_; }

 private:
  std::string dir_;
  LocalModel model_;
  bool self_normalized_;
  size_t history_slots_;
  float floor_;
};

// A `cslm serve` server: each session holds its own connection, and on a lost
// connection (or a server busy or shutting down) reconnects up to `retries`
// times, waiting 0.2 s, 0.4 s, ... between tries and saying so on `log`.
class ServerBackend : public Backend {
 public:
  // Connects once for the handshake (order, special ids, vocabulary). If
  // model_dir is not empty, its cslm.vocab must equal the server's vocabulary.
  ServerBackend(const std::string& host, uint16_t port, double timeout_seconds, int retries, float floor,
                const std::string& model_dir, std::ostream* log, const std::string& who);

  Session* NewSession() const;
  std::string Where() const;
  const std::string& checksum() const { return checksum_; }

 private:
  std::string host_;
  uint16_t port_;
  double timeout_;
  int retries_;
  float floor_;
  std::ostream* log_;
  std::string who_;
  std::string checksum_;
};

}  // namespace cslm

#endif  // CSLM_BACKEND_H_
