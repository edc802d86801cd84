// cslm_json.cc -- see cslm_json.h.
#include "cslm_json.h"

#include <stdlib.h>

#include <sstream>
#include <stdexcept>

namespace cslm {

// Recursive descent over the text, one value at a time; nesting is bounded so
// that a hostile file cannot exhaust the stack.
class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& file) : s_(text), file_(file), at_(0) {}

  Json Document() {
    Json v = Value(0);
    Space();
    if (at_ != s_.size()) Fail("text after the value");
    return v;
  }

 private:
  static const int kMaxDepth = 64;

  void Fail(const std::string& why) const {
    std::ostringstream m;
    m << file_ << ": malformed JSON at byte " << at_ << " (" << why << ")";
    throw std::runtime_error(m.str());
  }

  void Space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
  }

  bool Literal(const char* word) {
    size_t n = 0;
    while (word[n]) ++n;
    if (s_.compare(at_, n, word) != 0) return false;
    at_ += n;
    return true;
  }

  Json Value(int depth) {
    if (depth > kMaxDepth) Fail("nested too deeply");
    Space();
    if (at_ >= s_.size()) Fail("a value expected");
    Json v;
    const char c = s_[at_];
    if (c == '{') {
      v.type_ = Json::kObject;
      ++at_;
      Space();
      if (at_ < s_.size() && s_[at_] == '}') {
        ++at_;
        return v;
      }
      for (;;) {
        Space();
        if (at_ >= s_.size() || s_[at_] != '"') Fail("a member name expected");
        const std::string key = String();
        Space();
        if (at_ >= s_.size() || s_[at_] != ':') Fail("':' expected");
        ++at_;
        v.object_[key] = Value(depth + 1);
        Space();
        if (at_ < s_.size() && s_[at_] == ',') {
          ++at_;
          continue;
        }
        if (at_ < s_.size() && s_[at_] == '}') {
          ++at_;
          return v;
        }
        Fail("',' or '}' expected");
      }
    }
    if (c == '[') {
      v.type_ = Json::kArray;
      ++at_;
      Space();
      if (at_ < s_.size() && s_[at_] == ']') {
        ++at_;
        return v;
      }
      for (;;) {
        v.array_.push_back(Value(depth + 1));
        Space();
        if (at_ < s_.size() && s_[at_] == ',') {
          ++at_;
          continue;
        }
        if (at_ < s_.size() && s_[at_] == ']') {
          ++at_;
          return v;
        }
        Fail("',' or ']' expected");
      }
    }
    if (c == '"') {
      v.type_ = Json::kString;
      v.string_ = String();
      return v;
    }
    if (Literal("true") || Literal("false")) {
      v.type_ = Json::kBool;
      v.boolean_ = c == 't';
      return v;
    }
    if (Literal("null")) return v;
    v.type_ = Json::kNumber;
    v.number_ = Number();
    return v;
  }

  // RFC 8259's number grammar, checked before strtod reads it.
  double Number() {
    const size_t start = at_;
    if (at_ < s_.size() && s_[at_] == '-') ++at_;
    if (at_ < s_.size() && s_[at_] == '0') {
      ++at_;
    } else if (!Digits()) {
      Fail("a value expected");
    }
    if (at_ < s_.size() && s_[at_] == '.') {
      ++at_;
      if (!Digits()) Fail("digits expected after '.'");
    }
    if (at_ < s_.size() && (s_[at_] == 'e' || s_[at_] == 'E')) {
      ++at_;
      if (at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-')) ++at_;
      if (!Digits()) Fail("digits expected in the exponent");
    }
    const std::string text = s_.substr(start, at_ - start);
    return strtod(text.c_str(), 0);
  }

  bool Digits() {
    const size_t start = at_;
    while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
    return at_ > start;
  }

  unsigned Hex4() {
    if (at_ + 4 > s_.size()) Fail("four hex digits expected");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[at_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= h - '0';
      else if (h >= 'a' && h <= 'f') u |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') u |= h - 'A' + 10;
      else Fail("a hex digit expected");
    }
    return u;
  }

  static void Utf8(unsigned u, std::string* out) {
    if (u < 0x80) {
      out->push_back(static_cast<char>(u));
    } else if (u < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (u >> 6)));
      out->push_back(static_cast<char>(0x80 | (u & 0x3F)));
    } else if (u < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (u >> 12)));
      out->push_back(static_cast<char>(0x80 | ((u >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (u & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (u >> 18)));
      out->push_back(static_cast<char>(0x80 | ((u >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((u >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (u & 0x3F)));
    }
  }

  std::string String() {
    ++at_;  // the opening quote
    std::string out;
    for (;;) {
      if (at_ >= s_.size()) Fail("unterminated string");
      const char c = s_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) Fail("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (at_ >= s_.size()) Fail("unterminated string");
      const char e = s_[at_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          unsigned u = Hex4();
          if (u >= 0xD800 && u < 0xDC00) {  // a surrogate pair
            if (!Literal("\\u")) Fail("a low surrogate expected");
            const unsigned low = Hex4();
            if (low < 0xDC00 || low >= 0xE000) Fail("a low surrogate expected");
            u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
          } else if (u >= 0xDC00 && u < 0xE000) {
            Fail("a lone low surrogate");
          }
          Utf8(u, &out);
          break;
        }
        default: Fail("unknown escape");
      }
    }
  }

  const std::string& s_;
  const std::string& file_;
  size_t at_;
};

Json Json::Parse(const std::string& text, const std::string& file) { return JsonParser(text, file).Document(); }

const Json* Json::Find(const std::string& key) const {
  if (type_ != kObject) return 0;
  std::map<std::string, Json>::const_iterator it = object_.find(key);
  return it == object_.end() ? 0 : &it->second;
}

}  // namespace cslm
