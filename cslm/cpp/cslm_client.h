// cslm_client.h -- a small C++11 client for the `cslm serve` n-gram scoring server.
//
// Plain POSIX sockets, no dependency beyond the C++11 standard library. The wire
// protocol (version 1) is specified in docs/cslm.md. One Client object owns one
// TCP connection and is not safe to share between threads without a lock: give
// each decoder thread its own Client (the server batches across connections).
//
//   cslm::Client lm("127.0.0.1", 5555, 10.0);   // connects + handshake, 10 s timeout
//   std::vector<uint32_t> ids = lm.lookup(words);  // map strings once, cache the ids
//   std::vector<uint32_t> flat = {...};           // count n-grams of n ids, oldest word first
//   std::vector<uint8_t> flags;
//   std::vector<float> lp = lm.score(flat, 7, &flags);  // natural-log P(last | previous)
//
// Every failure throws a subclass of cslm::Error: ConnectError (cannot reach or
// handshake), TimeoutError (no reply in time), ConnectionLost (peer closed or
// reset), ServerError (the server answered with an error frame; it then closes
// the connection), ProtocolError (the server sent something unexpected). After
// any of these the connection is closed; construct a new Client to reconnect.
// Bad arguments (an id >= vocab_size(), n out of range) throw
// std::invalid_argument before anything is sent and leave the connection open.
#ifndef CSLM_CLIENT_H_
#define CSLM_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace cslm {

static const uint16_t kProtocolVersion = 1;

// Per-n-gram flags returned beside each log-probability.
enum ScoreFlags {
  kUnknown = 1,  // the predicted word is outside the model's shortlist
  kBackoff = 2,  // the value came from the back-off n-gram model (backoff mode)
};

// Server error codes (ERROR frame); see docs/cslm.md.
enum ErrorCode {
  kErrMalformed = 1,
  kErrVersion = 2,
  kErrTooLarge = 3,
  kErrBadRequest = 4,
  kErrNoHandshake = 5,
  kErrUnknownType = 6,
  kErrShuttingDown = 7,
  kErrInternal = 8,
  kErrBusy = 9,  // at its connection limit with every connection busy: try again later
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};
class ConnectError : public Error {
 public:
  explicit ConnectError(const std::string& what) : Error(what) {}
};
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};
class ConnectionLost : public Error {
 public:
  explicit ConnectionLost(const std::string& what) : Error(what) {}
};
class ProtocolError : public Error {
 public:
  explicit ProtocolError(const std::string& what) : Error(what) {}
};
class ServerError : public Error {
 public:
  ServerError(uint32_t code, const std::string& what) : Error(what), code_(code) {}
  uint32_t code() const { return code_; }

 private:
  uint32_t code_;
};

// What the server said about its model in the handshake.
struct ServerInfo {
  uint16_t version;
  uint16_t order;            // n of the model: an n-gram has at most `order` words
  uint32_t vocab_size;       // ids are 0 .. vocab_size-1
  uint32_t bos_id;           // <s>
  uint32_t eos_id;           // </s>
  uint32_t unk_id;           // [UNK]: lookup() returns it for words outside the shortlist
  uint32_t max_frame_bytes;  // largest payload the server accepts
  uint8_t mode;              // 0: unknown words map to [UNK]; 1: back off to an n-gram model
  std::string checksum;      // SHA-256 of the vocabulary file, 64 hex digits
};

class Client {
 public:
  // Connects to host:port (name or address) and performs the handshake.
  // `timeout_seconds` bounds the connect and every later reply (<= 0: wait forever).
  // If `expected_checksum` is not empty it must equal the server's vocabulary
  // checksum (hex), else ConnectError is thrown.
  Client(const std::string& host, uint16_t port, double timeout_seconds = 10.0,
         const std::string& expected_checksum = std::string());
  ~Client();

  const ServerInfo& info() const { return info_; }
  unsigned order() const { return info_.order; }
  uint32_t vocab_size() const { return info_.vocab_size; }
  uint32_t bos_id() const { return info_.bos_id; }
  uint32_t eos_id() const { return info_.eos_id; }
  uint32_t unk_id() const { return info_.unk_id; }
  const std::string& checksum() const { return info_.checksum; }
  bool connected() const { return fd_ >= 0; }

  // Word strings -> ids (unk_id() for words outside the shortlist).
  std::vector<uint32_t> lookup(const std::vector<std::string>& words);

  // The whole vocabulary in id order.
  std::vector<std::string> vocabulary();

  // Scores `count` n-grams of `n` ids each (1 <= n <= order()), laid out
  // contiguously, oldest word first, predicted word last. Shorter n-grams are
  // left-padded with <s> by the server. Writes natural-log probabilities to
  // logprobs[0..count) and, if `flags` is not null, ScoreFlags to flags[0..count).
  void score(const uint32_t* ids, size_t count, unsigned n, float* logprobs, uint8_t* flags);

  // Convenience form: `ids.size()` must be a multiple of n.
  std::vector<float> score(const std::vector<uint32_t>& ids, unsigned n,
                           std::vector<uint8_t>* flags = 0);

  // Scores n-grams given as space-separated words (1..order() words each);
  // in backoff mode the server can score words outside the shortlist this way.
  std::vector<float> score_text(const std::vector<std::string>& ngrams, std::vector<uint8_t>* flags = 0);

  // Server statistics as a JSON document.
  std::string stats();

  void close();

 private:
  Client(const Client&);             // not copyable
  Client& operator=(const Client&);  // not assignable

  // Sends one frame and waits for the reply with the same request id.
  void request(uint8_t type, const std::string& payload, uint8_t expect, std::string* reply);
  void send_all(const char* data, size_t size);
  void recv_all(char* data, size_t size);
  void fail_closed();
  void parse_scores(const std::string& reply, size_t count, float* logprobs, uint8_t* flags);

  int fd_;
  int timeout_ms_;
  uint32_t next_id_;
  ServerInfo info_;
  std::string where_;  // "host:port" for messages
};

}  // namespace cslm

#endif  // CSLM_CLIENT_H_
