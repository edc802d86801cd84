// cslm_json.h -- a small JSON reader for the files of a model directory
// (config.json, the header of model.safetensors): RFC 8259 values, read whole
// into a tree. No dependency beyond C++11.
//
//   cslm::Json cfg = cslm::Json::Parse(text, "MODEL/config.json");
//   const cslm::Json* order = cfg.Find("config") ? cfg.Find("config")->Find("order") : 0;
//
// Parse throws std::runtime_error("FILE: malformed JSON at byte N (reason)").
#ifndef CSLM_JSON_H_
#define CSLM_JSON_H_

#include <stddef.h>

#include <map>
#include <string>
#include <vector>

namespace cslm {

class Json {
 public:
  enum Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Json() : type_(kNull), number_(0), boolean_(false) {}

  // Parses a whole document; `file` names it in errors.
  static Json Parse(const std::string& text, const std::string& file);

  Type type() const { return type_; }
  bool is_number() const { return type_ == kNumber; }
  bool is_string() const { return type_ == kString; }
  bool is_object() const { return type_ == kObject; }
  bool is_array() const { return type_ == kArray; }

  // The value; meaningful only for the matching type (else 0, false or empty).
  double number() const { return number_; }
  bool boolean() const { return boolean_; }
  const std::string& string() const { return string_; }
  const std::vector<Json>& array() const { return array_; }
  const std::map<std::string, Json>& object() const { return object_; }

  // The member `key` of an object, or null if absent or if this is not an object.
  const Json* Find(const std::string& key) const;

 private:
  friend class JsonParser;
  Type type_;
  double number_;
  bool boolean_;
  std::string string_;
  std::vector<Json> array_;
  std::map<std::string, Json> object_;
};

}  // namespace cslm

#endif  // CSLM_JSON_H_
