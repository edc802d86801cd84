// cslm_test_input.h -- the n-gram input of the C++ test drivers (cslm_local_test,
// cslm_backend_test): one n-gram a line, 1..order words, oldest first; words
// outside the vocabulary become [UNK], fewer than order words are left-padded
// with <s>. A joint model's rows (ReadJointRows, cslm_local_test) are whole
// instead: order-1 target words, window source words, the predicted target word.
// Not part of the feature.
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

// A joint model's rows: each line exactly order-1 target words, `window` source
// words and the predicted target word (row_size ids, no padding: <s> and </s>
// are written out); target words are looked up in `words`, source words in
// `src_words`, either becoming its vocabulary's [UNK] when absent. Returns the
// count, or 0 with `error` set ("line N: expected ROW words").
inline size_t ReadJointRows(std::istream& in, const std::vector<std::string>& words,
                            const std::vector<std::string>& src_words, unsigned order, unsigned window,
                            std::vector<uint32_t>* flat, std::string* error) {
  std::unordered_map<std::string, uint32_t> ids, src_ids;
  for (size_t i = 0; i < words.size(); ++i) ids[words[i]] = static_cast<uint32_t>(i);
  for (size_t i = 0; i < src_words.size(); ++i) src_ids[src_words[i]] = static_cast<uint32_t>(i);
  const uint32_t unk = ids.count("[UNK]") ? ids["[UNK]"] : 0, src_unk = src_ids.count("[UNK]") ? src_ids["[UNK]"] : 0;
  const size_t row = order + window;
  std::string line;
  size_t count = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> g;
    std::string w;
    while (fields >> w) g.push_back(w);
    if (g.size() != row) {
      std::ostringstream m;
      m << "line " << count + 1 << ": expected " << row << " words (" << order - 1 << " target, " << window
        << " source, the predicted word)";
      *error = m.str();
      return 0;
    }
    for (size_t k = 0; k < row; ++k) {
      const bool source = k >= order - 1 && k + 1 < row;
      const std::unordered_map<std::string, uint32_t>& vocab = source ? src_ids : ids;
      std::unordered_map<std::string, uint32_t>::const_iterator it = vocab.find(g[k]);
      flat->push_back(it != vocab.end() ? it->second : source ? src_unk : unk);
    }
    ++count;
  }
  return count;
}

}  // namespace cslm

#endif  // CSLM_TEST_INPUT_H_
