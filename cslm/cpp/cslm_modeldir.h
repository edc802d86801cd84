// cslm_modeldir.h -- the files of a model directory that `cslm train` writes
// (mtcommon/modeldir.py: config.json, model.safetensors, *.vocab), read in C++
// for the in-process evaluator (cslm_local.h) and the Moses features. Every
// error is a std::runtime_error("FILE: reason"), one line. No dependency beyond
// C++11.
//
//   cslm::Json cfg = cslm::Json::Parse(cslm::ReadFile(dir + "/config.json"), dir + "/config.json");
//   cslm::SafeTensors st(dir + "/model.safetensors");
//   std::vector<float> w;
//   std::vector<size_t> shape = st.Get("embed.weight", 2, &w);
#ifndef CSLM_MODELDIR_H_
#define CSLM_MODELDIR_H_

#include <stddef.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cslm_json.h"

namespace cslm {

// The error "FILE: why".
std::runtime_error FileError(const std::string& file, const std::string& why);

// The whole of a file's bytes; throws FileError(path, "cannot read ...") where it cannot be read.
std::string ReadFile(const std::string& path);

// The words of a vocabulary file (`word<TAB>count` per line) in id order; throws "FILE: cannot read".
std::vector<std::string> ReadVocabulary(const std::string& path);

// A whole number >= 0 from a JSON value of `file`, or FileError(file, WHAT + " is not a whole number >= 0").
size_t WholeNumber(const Json& v, const std::string& file, const std::string& what);

// The float32 tensors of a safetensors file (little-endian), by name. The file is read whole at
// construction, its header checked as JSON; each tensor's dtype, dimensions and byte range are checked
// when it is asked for.
class SafeTensors {
 public:
  explicit SafeTensors(const std::string& path);
  // True if the file holds a tensor of that name.
  bool Has(const std::string& name) const;
  // Copies tensor `name` (float32, `dims` dimensions) into out (a vector of floats, any allocator) and
  // returns its shape; throws FileError naming the tensor if it is absent, of another dtype or number of
  // dimensions, or if its bytes do not match its shape.
  template <class FloatVector>
  std::vector<size_t> Get(const std::string& name, size_t dims, FloatVector* out) const {
    std::vector<size_t> shape;
    size_t count = 0;
    const char* data = Find(name, dims, &shape, &count);
    out->resize(count);
    if (count) std::memcpy(&(*out)[0], data, count * 4);
    return shape;
  }

 private:
  // The checked tensor's first byte, its shape and number of floats (Get's checks).
  const char* Find(const std::string& name, size_t dims, std::vector<size_t>* shape, size_t* count) const;
  std::string path_, blob_;
  Json header_;
  size_t data_;
};

}  // namespace cslm

#endif  // CSLM_MODELDIR_H_
