// cslm_test_input.h -- the n-gram input of the C++ test drivers (cslm_local_test,
// cslm_backend_test): one n-gram a line, 1..order words, oldest first; words
// outside the vocabulary become [UNK], fewer than order words are left-padded
// with <s>. Not part of the feature.
#ifndef CSLM_TEST_INPUT_H_
#define CSLM_TEST_INPUT_H_

#include <stddef.h>
#include <stdint.h>

#include <istream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace cslm {

// Reads every line of `in` into `flat` (count x order ids); returns the count,
// or 0 with `error` set ("line N: expected 1..ORDER words").
inline size_t ReadNgrams(std::istream& in, const std::vector<std::string>& words, unsigned order, uint32_t bos,
                         uint32_t unk, std::vector<uint32_t>* flat, std::string* error) {
  std::unordered_map<std::string, uint32_t> ids;
  for (size_t i = 0; i < words.size(); ++i) ids[words[i]] = static_cast<uint32_t>(i);
  std::string line;
  size_t count = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<uint32_t> g;
    std::string w;
    while (fields >> w) {
      std::unordered_map<std::string, uint32_t>::const_iterator it = ids.find(w);
      g.push_back(it == ids.end() ? unk : it->second);
    }
    if (g.empty() || g.size() > order) {
      std::ostringstream m;
      m << "line " << count + 1 << ": expected 1.." << order << " words";
      *error = m.str();
      return 0;
    }
    flat->insert(flat->end(), order - g.size(), bos);
    flat->insert(flat->end(), g.begin(), g.end());
    ++count;
  }
  return count;
}

}  // namespace cslm

#endif  // CSLM_TEST_INPUT_H_
