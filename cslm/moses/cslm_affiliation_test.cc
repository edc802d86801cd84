// cslm_affiliation_test.cc -- prints cslm::phrase_affiliations for phrase pairs
// read from stdin, one per line: `SRC_LEN TGT_LEN i-j i-j ...` (indices inside
// the phrase pair). tests/test_nnjm_moses.py compares the output with
// cslm.data.affiliations, the rules training uses.
#include <iostream>
#include <sstream>
#include <string>

#include "cslm_affiliation.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    size_t src_len = 0, tgt_len = 0;
    in >> src_len >> tgt_len;
    std::vector<std::vector<size_t> > aligned(tgt_len);
    std::string pair;
    while (in >> pair) {
      const size_t dash = pair.find('-');
      const size_t i = std::stoul(pair.substr(0, dash)), j = std::stoul(pair.substr(dash + 1));
      std::vector<size_t>& a = aligned.at(j);
      std::vector<size_t>::iterator at = a.begin();
      while (at != a.end() && *at < i) ++at;
      if (at == a.end() || *at != i) a.insert(at, i);  // ascending, each once, as Moses's std::set
    }
    std::vector<size_t> out;
    cslm::phrase_affiliations(aligned, src_len, &out);
    for (size_t k = 0; k < out.size(); ++k) std::cout << (k ? " " : "") << out[k];
    std::cout << "\n";
  }
  return 0;
}
