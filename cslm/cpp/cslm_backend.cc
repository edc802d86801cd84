// cslm_backend.cc -- see cslm_backend.h.
#include "cslm_backend.h"

#include <unistd.h>

#include <memory>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "cslm_modeldir.h"

namespace cslm {

void Backend::Session::Evaluate(const uint32_t* ngrams, size_t count, float* logprobs, uint8_t* flags) {
  if (!count) return;
  evaluated += count;
  Compute(ngrams, count, logprobs, flags);
  // The floor keeps one unlikely word from dominating a hypothesis' score; the
  // negated comparison also catches NaN and -inf.
  for (size_t k = 0; k < count; ++k)
    if (!(logprobs[k] >= floor_)) logprobs[k] = floor_;
}

namespace {

std::string Address(const std::string& host, uint16_t port) {
  std::ostringstream w;
  w << host << ":" << port;
  return w.str();
}

class LocalSession : public Backend::Session {
 public:
  LocalSession(const LocalModel& model, bool normalized, size_t history_slots, float floor)
      : Session(floor), model_(model), normalized_(normalized), scratch_(history_slots) {}

  size_t HiddenComputed() const { return scratch_.misses; }
  void ResetCounters() {
    Session::ResetCounters();
    scratch_.hits = scratch_.misses = 0;
  }

 protected:
  void Compute(const uint32_t* ngrams, size_t count, float* logprobs, uint8_t* flags) {
    model_.Score(ngrams, count, normalized_, logprobs, &scratch_);
    const unsigned n = model_.row_size();  // the predicted word is each row's last id
    for (size_t k = 0; k < count; ++k) flags[k] = ngrams[k * n + n - 1] == model_.unk_id() ? kUnknown : 0;
  }

 private:
  const LocalModel& model_;
  bool normalized_;
  LocalModel::Scratch scratch_;
};

class ServerSession : public Backend::Session {
 public:
  ServerSession(const std::string& host, uint16_t port, double timeout, int retries, float floor,
                const std::string& checksum, unsigned order, std::ostream* log, const std::string& who)
      : Session(floor), host_(host), port_(port), timeout_(timeout), retries_(retries), checksum_(checksum),
        order_(order), log_(log), who_(who) {}

 protected:
  void Compute(const uint32_t* ngrams, size_t count, float* logprobs, uint8_t* flags) {
    std::string last_error;
    for (int attempt = 0; attempt <= retries_; ++attempt) {
      try {
        if (!client_.get() || !client_->connected()) client_.reset(new Client(host_, port_, timeout_, checksum_));
        client_->score(ngrams, count, order_, logprobs, flags);
        ++requests;
        return;
      } catch (const ServerError& e) {
        client_.reset();
        // A server busy or shutting down may take a new connection; any other refusal is final.
        if (e.code() != kErrShuttingDown && e.code() != kErrBusy)
          throw Error("the CSLM server at " + Where() + " refused a request (" + e.what() + ")");
        last_error = e.what();
      } catch (const Error& e) {
        client_.reset();
        last_error = e.what();
      }
      if (attempt < retries_) {
        if (log_)
          *log_ << who_ << ": " << last_error << "; reconnecting (" << attempt + 1 << "/" << retries_ << ")"
                << std::endl;
        usleep(200000u << (attempt < 5 ? attempt : 5));
      }
    }
    std::ostringstream m;
    m << "lost the CSLM server at " << Where() << " (" << last_error << ") after " << retries_ << " retries";
    throw Error(m.str());
  }

 private:
  std::string Where() const { return Address(host_, port_); }

  std::string host_;
  uint16_t port_;
  double timeout_;
  int retries_;
  std::string checksum_;
  unsigned order_;
  std::ostream* log_;
  std::string who_;
  std::unique_ptr<Client> client_;
};

}  // namespace

LocalBackend::LocalBackend(const std::string& model_dir, int self_normalized, size_t history_slots, float floor,
                           Precision precision)
    : dir_(model_dir), model_(model_dir, precision), history_slots_(history_slots), floor_(floor) {
  self_normalized_ = self_normalized == -1 ? model_.self_normalized() : self_normalized != 0;
  facts_.order = model_.order();
  facts_.source_window = model_.source_window();
  facts_.source_words = model_.source_vocabulary();
  facts_.source_bos = model_.source_bos_id();
  facts_.source_eos = model_.source_eos_id();
  facts_.source_unk = model_.source_unk_id();
  facts_.bos = model_.bos_id();
  facts_.eos = model_.eos_id();
  facts_.unk = model_.unk_id();
  facts_.words = model_.vocabulary();
}

Backend::Session* LocalBackend::NewSession() const {
  return new LocalSession(model_, !self_normalized_, history_slots_, floor_);
}

ServerBackend::ServerBackend(const std::string& host, uint16_t port, double timeout_seconds, int retries, float floor,
                             const std::string& model_dir, std::ostream* log, const std::string& who)
    : host_(host), port_(port), timeout_(timeout_seconds), retries_(retries), floor_(floor), log_(log), who_(who) {
  Client client(host_, port_, timeout_);
  facts_.order = client.order();
  facts_.bos = client.bos_id();
  facts_.eos = client.eos_id();
  facts_.unk = client.unk_id();
  facts_.words = client.vocabulary();
  checksum_ = client.checksum();
  if (!model_dir.empty()) {  // the server must serve this model: same vocabulary, same ids
    const std::string file = model_dir + "/cslm.vocab";
    const std::vector<std::string> mine = ReadVocabulary(file);
    if (mine != facts_.words) {
      std::ostringstream m;
      m << "the server at " << Where() << " serves a model whose vocabulary differs from " << file << " ("
        << facts_.words.size() << " vs " << mine.size() << " words)";
      throw std::runtime_error(m.str());
    }
  }
}

Backend::Session* ServerBackend::NewSession() const {
  return new ServerSession(host_, port_, timeout_, retries_, floor_, checksum_, facts_.order, log_, who_);
}

std::string ServerBackend::Where() const { return Address(host_, port_); }

}  // namespace cslm
