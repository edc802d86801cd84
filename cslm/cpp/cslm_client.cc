// cslm_client.cc -- implementation of the C++11 client; see cslm_client.h and docs/cslm.md.
#include "cslm_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <sstream>

namespace cslm {

namespace {

// Frame types (docs/cslm.md, "Frames"). Replies carry the request type | 0x80.
const uint8_t kHello = 0x01;
const uint8_t kScore = 0x02;
const uint8_t kScoreText = 0x03;
const uint8_t kLookup = 0x04;
const uint8_t kVocab = 0x05;
const uint8_t kStats = 0x06;
const uint8_t kScores = 0x82;
const uint8_t kError = 0x7F;
const size_t kHeader = 12;
const size_t kHelloReply = 64;

// All integers on the wire are little-endian, whatever the host's byte order.
void put_u16(std::string* s, uint16_t v) {
  s->push_back(static_cast<char>(v & 0xff));
  s->push_back(static_cast<char>((v >> 8) & 0xff));
}
void put_u32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t get_u16(const char* p) {
  const unsigned char* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
uint32_t get_u32(const char* p) {
  const unsigned char* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) | (static_cast<uint32_t>(u[2]) << 16) |
         (static_cast<uint32_t>(u[3]) << 24);
}
float get_f32(const char* p) {
  uint32_t bits = get_u32(p);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

std::string errno_text(int err) {
  char buf[256];
  buf[0] = 0;
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  return std::string(strerror_r(err, buf, sizeof buf));
#else
  strerror_r(err, buf, sizeof buf);
  return std::string(buf);
#endif
}

// Waits until fd is readable/writable; false on timeout.
bool wait_fd(int fd, short events, int timeout_ms) {
  struct pollfd p;
  p.fd = fd;
  p.events = events;
  p.revents = 0;
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // let the following send/recv report the error
  }
}

}  // namespace

Client::Client(const std::string& host, uint16_t port, double timeout_seconds, const std::string& expected_checksum)
    : fd_(-1), timeout_ms_(timeout_seconds > 0 ? static_cast<int>(timeout_seconds * 1000.0 + 0.5) : -1), next_id_(1) {
  std::ostringstream where;
  where << host << ":" << port;
  where_ = where.str();
  info_.version = info_.order = 0;
  info_.vocab_size = info_.bos_id = info_.eos_id = info_.unk_id = info_.max_frame_bytes = 0;
  info_.mode = 0;

  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = 0;
  std::ostringstream port_str;
  port_str << port;
  int gai = ::getaddrinfo(host.c_str(), port_str.str().c_str(), &hints, &res);
  if (gai != 0) throw ConnectError("cslm: cannot resolve " + where_ + ": " + gai_strerror(gai));

  std::string last_error = "no address";
  for (struct addrinfo* ai = res; ai != 0 && fd_ < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) {
      last_error = errno_text(errno);
      continue;
    }
    // Non-blocking connect so the timeout applies, then back to blocking I/O
    // (every later send/recv is preceded by poll() with the timeout).
    int fl = ::fcntl(fd, F_GETFL, 0);
    ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    int r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r < 0 && errno == EINPROGRESS) {
      if (!wait_fd(fd, POLLOUT, timeout_ms_)) {
        ::close(fd);
        last_error = "timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      r = err ? -1 : 0;
      errno = err;
    }
    if (r < 0) {
      last_error = errno_text(errno);
      ::close(fd);
      continue;
    }
    ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
#ifdef SO_NOSIGPIPE
    ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    fd_ = fd;
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) throw ConnectError("cslm: cannot connect to " + where_ + ": " + last_error);

  // Handshake: HELLO carries the magic and our protocol version; the reply
  // describes the model (docs/cslm.md, "Handshake").
  std::string hello("CSLM", 4);
  put_u16(&hello, kProtocolVersion);
  put_u16(&hello, 0);
  std::string reply;
  try {
    request(kHello, hello, kHello | 0x80, &reply);
  } catch (const ServerError& e) {
    throw ConnectError("cslm: handshake with " + where_ + " refused: " + e.what());
  } catch (const Error& e) {
    throw ConnectError("cslm: handshake with " + where_ + " failed: " + e.what());
  }
  if (reply.size() < kHelloReply || reply.compare(0, 4, "CSLM") != 0) {
    fail_closed();
    throw ConnectError("cslm: " + where_ + " is not a cslm server (bad handshake reply)");
  }
  const char* p = reply.data();
  info_.version = get_u16(p + 4);
  info_.order = get_u16(p + 6);
  info_.vocab_size = get_u32(p + 8);
  info_.bos_id = get_u32(p + 12);
  info_.eos_id = get_u32(p + 16);
  info_.unk_id = get_u32(p + 20);
  info_.max_frame_bytes = get_u32(p + 24);
  info_.mode = static_cast<uint8_t>(p[28]);
  static const char hex[] = "0123456789abcdef";
  info_.checksum.clear();
  for (int i = 0; i < 32; ++i) {
    unsigned char c = static_cast<unsigned char>(p[32 + i]);
    info_.checksum.push_back(hex[c >> 4]);
    info_.checksum.push_back(hex[c & 15]);
  }
  if (info_.version != kProtocolVersion) {
    fail_closed();
    throw ConnectError("cslm: " + where_ + " speaks an unsupported protocol version");
  }
  if (!expected_checksum.empty() && expected_checksum != info_.checksum) {
    fail_closed();
    throw ConnectError("cslm: " + where_ + " serves a model with vocabulary checksum " + info_.checksum +
                       ", expected " + expected_checksum);
  }
}

Client::~Client() { close(); }

void Client::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Client::fail_closed() { close(); }

void Client::send_all(const char* data, size_t size) {
  while (size > 0) {
    if (!wait_fd(fd_, POLLOUT, timeout_ms_)) {
      fail_closed();
      throw TimeoutError("cslm: timed out sending to " + where_);
    }
#ifdef MSG_NOSIGNAL
    ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL);
#else
    ssize_t n = ::send(fd_, data, size, 0);
#endif
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      std::string why = errno_text(errno);
      fail_closed();
      throw ConnectionLost("cslm: connection to " + where_ + " lost while sending: " + why);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void Client::recv_all(char* data, size_t size) {
  while (size > 0) {
    if (!wait_fd(fd_, POLLIN, timeout_ms_)) {
      fail_closed();
      throw TimeoutError("cslm: timed out waiting for " + where_);
    }
    ssize_t n = ::recv(fd_, data, size, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      std::string why = errno_text(errno);
      fail_closed();
      throw ConnectionLost("cslm: connection to " + where_ + " lost: " + why);
    }
    if (n == 0) {
      fail_closed();
      throw ConnectionLost("cslm: " + where_ + " closed the connection");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void Client::request(uint8_t type, const std::string& payload, uint8_t expect, std::string* reply) {
  if (fd_ < 0) throw ConnectionLost("cslm: not connected to " + where_);
  if (info_.max_frame_bytes && payload.size() > info_.max_frame_bytes)
    throw std::invalid_argument("cslm: request of " + std::to_string(payload.size()) +
                                " bytes exceeds the server's frame limit; split it");
  uint32_t id = next_id_++;
  if (next_id_ == 0) next_id_ = 1;
  // Header: u32 payload length, u8 type, u8 flags, u16 reserved, u32 request id.
  std::string frame;
  frame.reserve(kHeader + payload.size());
  put_u32(&frame, static_cast<uint32_t>(payload.size()));
  frame.push_back(static_cast<char>(type));
  frame.push_back(0);
  put_u16(&frame, 0);
  put_u32(&frame, id);
  frame += payload;
  send_all(frame.data(), frame.size());

  for (;;) {
    char head[kHeader];
    recv_all(head, kHeader);
    uint32_t length = get_u32(head);
    uint8_t rtype = static_cast<uint8_t>(head[4]);
    uint32_t rid = get_u32(head + 8);
    if (info_.max_frame_bytes && length > info_.max_frame_bytes + 1024u) {
      fail_closed();
      throw ProtocolError("cslm: " + where_ + " sent an oversized frame");
    }
    reply->resize(length);
    if (length) recv_all(&(*reply)[0], length);
    if (rtype == kError) {
      uint32_t code = length >= 4 ? get_u32(reply->data()) : 0;
      std::string msg = length > 4 ? reply->substr(4) : std::string("(no message)");
      fail_closed();  // the server closes the connection after an error reply
      throw ServerError(code, "cslm: server " + where_ + ": " + msg);
    }
    if (rid != id) continue;  // a stale reply (cannot happen with one request in flight)
    if (rtype != expect) {
      fail_closed();
      throw ProtocolError("cslm: " + where_ + " replied with an unexpected frame type");
    }
    return;
  }
}

void Client::parse_scores(const std::string& reply, size_t count, float* logprobs, uint8_t* flags) {
  if (reply.size() != 4 + 5 * count || get_u32(reply.data()) != count) {
    fail_closed();
    throw ProtocolError("cslm: " + where_ + " sent a SCORES reply of the wrong size");
  }
  const char* p = reply.data() + 4;
  for (size_t i = 0; i < count; ++i) logprobs[i] = get_f32(p + 4 * i);
  if (flags) memcpy(flags, p + 4 * count, count);
}

void Client::score(const uint32_t* ids, size_t count, unsigned n, float* logprobs, uint8_t* flags) {
  if (n < 1 || n > info_.order) throw std::invalid_argument("cslm: n-gram size out of range 1..order");
  for (size_t i = 0; i < count * n; ++i)
    if (ids[i] >= info_.vocab_size) throw std::invalid_argument("cslm: word id outside the vocabulary");
  if (count == 0) return;
  std::string payload;
  payload.reserve(8 + 4 * count * n);
  put_u32(&payload, static_cast<uint32_t>(count));
  put_u32(&payload, n);
  for (size_t i = 0; i < count * n; ++i) put_u32(&payload, ids[i]);
  std::string reply;
  request(kScore, payload, kScores, &reply);
  parse_scores(reply, count, logprobs, flags);
}

std::vector<float> Client::score(const std::vector<uint32_t>& ids, unsigned n, std::vector<uint8_t>* flags) {
  if (n < 1 || ids.size() % n != 0) throw std::invalid_argument("cslm: ids.size() is not a multiple of n");
  size_t count = ids.size() / n;
  std::vector<float> out(count);
  if (flags) flags->resize(count);
  if (count) score(&ids[0], count, n, &out[0], flags ? &(*flags)[0] : 0);
  return out;
}

std::vector<float> Client::score_text(const std::vector<std::string>& ngrams, std::vector<uint8_t>* flags) {
  std::vector<float> out(ngrams.size());
  if (flags) flags->resize(ngrams.size());
  if (ngrams.empty()) return out;
  std::string payload;
  put_u32(&payload, static_cast<uint32_t>(ngrams.size()));
  for (size_t i = 0; i < ngrams.size(); ++i) {
    if (ngrams[i].find('\n') != std::string::npos) throw std::invalid_argument("cslm: n-gram text contains a newline");
    if (i) payload.push_back('\n');
    payload += ngrams[i];
  }
  std::string reply;
  request(kScoreText, payload, kScores, &reply);
  parse_scores(reply, ngrams.size(), &out[0], flags ? &(*flags)[0] : 0);
  return out;
}

std::vector<uint32_t> Client::lookup(const std::vector<std::string>& words) {
  std::vector<uint32_t> ids(words.size());
  if (words.empty()) return ids;
  std::string payload;
  put_u32(&payload, static_cast<uint32_t>(words.size()));
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i].find('\n') != std::string::npos) throw std::invalid_argument("cslm: word contains a newline");
    if (i) payload.push_back('\n');
    payload += words[i];
  }
  std::string reply;
  request(kLookup, payload, kLookup | 0x80, &reply);
  if (reply.size() != 4 + 4 * words.size() || get_u32(reply.data()) != words.size()) {
    fail_closed();
    throw ProtocolError("cslm: " + where_ + " sent an IDS reply of the wrong size");
  }
  for (size_t i = 0; i < words.size(); ++i) ids[i] = get_u32(reply.data() + 4 + 4 * i);
  return ids;
}

std::vector<std::string> Client::vocabulary() {
  std::string reply;
  request(kVocab, std::string(), kVocab | 0x80, &reply);
  if (reply.size() < 4) {
    fail_closed();
    throw ProtocolError("cslm: " + where_ + " sent a short VOCAB reply");
  }
  uint32_t count = get_u32(reply.data());
  std::vector<std::string> words;
  words.reserve(count);
  size_t start = 4;
  while (count && start <= reply.size()) {
    size_t end = reply.find('\n', start);
    if (end == std::string::npos) end = reply.size();
    words.push_back(reply.substr(start, end - start));
    start = end + 1;
  }
  if (words.size() != count) {
    fail_closed();
    throw ProtocolError("cslm: " + where_ + " sent a VOCAB reply with the wrong word count");
  }
  return words;
}

std::string Client::stats() {
  std::string reply;
  request(kStats, std::string(), kStats | 0x80, &reply);
  return reply;
}

}  // namespace cslm
