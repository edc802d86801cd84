// cslm_modeldir.cc -- see cslm_modeldir.h.
#include "cslm_modeldir.h"

#include <stdint.h>

#include <fstream>
#include <sstream>

namespace cslm {

std::runtime_error FileError(const std::string& file, const std::string& why) {
  return std::runtime_error(file + ": " + why);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path.c_str(), std::ios::binary);
  if (!in) throw FileError(path, "cannot read (is the path a `cslm train` model directory?)");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> ReadVocabulary(const std::string& path) {
  std::ifstream in(path.c_str());
  if (!in) throw FileError(path, "cannot read");
  std::vector<std::string> words;
  std::string line;
  while (std::getline(in, line)) words.push_back(line.substr(0, line.find('\t')));
  return words;
}

size_t WholeNumber(const Json& v, const std::string& file, const std::string& what) {
  if (!v.is_number() || v.number() < 0 || v.number() != static_cast<double>(static_cast<size_t>(v.number())))
    throw FileError(file, what + " is not a whole number >= 0");
  return static_cast<size_t>(v.number());
}

namespace {

// One tensor of a safetensors file: dtype, shape, byte range of the data.
struct TensorInfo {
  std::string dtype;
  std::vector<size_t> shape;
  size_t begin, end;
};

// The entry `"name": {"dtype": ..., "shape": [...], "data_offsets": [a, b]}` of a
// safetensors header. Returns false if the name is absent.
bool FindTensor(const Json& header, const std::string& name, TensorInfo* t, const std::string& file) {
  const Json* entry = header.Find(name);
  if (!entry) return false;
  const Json* dtype = entry->Find("dtype");
  const Json* shape = entry->Find("shape");
  const Json* offsets = entry->Find("data_offsets");
  if (!dtype || !dtype->is_string()) throw FileError(file, name + " has no dtype");
  if (!shape || !shape->is_array()) throw FileError(file, name + " has no shape");
  if (!offsets || !offsets->is_array() || offsets->array().size() != 2)
    throw FileError(file, name + ": data_offsets must have two numbers");
  t->dtype = dtype->string();
  t->shape.clear();
  for (size_t i = 0; i < shape->array().size(); ++i)
    t->shape.push_back(WholeNumber(shape->array()[i], file, name + "'s shape"));
  t->begin = WholeNumber(offsets->array()[0], file, name + "'s data_offsets");
  t->end = WholeNumber(offsets->array()[1], file, name + "'s data_offsets");
  return true;
}

}  // namespace

SafeTensors::SafeTensors(const std::string& path) : path_(path), blob_(ReadFile(path)) {
  if (blob_.size() < 8) throw FileError(path, "too short for a safetensors file");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(blob_[i]);
  if (n > blob_.size() - 8) throw FileError(path, "header length beyond the end of the file (truncated?)");
  header_ = Json::Parse(blob_.substr(8, n), path);
  if (!header_.is_object()) throw FileError(path, "the header is not a JSON object");
  data_ = 8 + n;
}

bool SafeTensors::Has(const std::string& name) const {
  TensorInfo t;
  return FindTensor(header_, name, &t, path_);
}

const char* SafeTensors::Find(const std::string& name, size_t dims, std::vector<size_t>* shape,
                              size_t* count) const {
  TensorInfo t;
  if (!FindTensor(header_, name, &t, path_)) throw FileError(path_, "no tensor " + name);
  if (t.dtype != "F32") throw FileError(path_, name + " is " + t.dtype + ", expected F32");
  if (t.shape.size() != dims) throw FileError(path_, name + " has the wrong number of dimensions");
  size_t n = 1;
  for (size_t i = 0; i < t.shape.size(); ++i) n *= t.shape[i];
  if (t.end < t.begin || t.end - t.begin != n * 4 || data_ + t.end > blob_.size())
    throw FileError(path_, name + ": byte range does not match its shape (truncated file?)");
  *shape = t.shape;
  *count = n;
  return blob_.data() + data_ + t.begin;
}

}  // namespace cslm
