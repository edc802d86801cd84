// cslm_client_test.cc -- round trip against a live `cslm serve`.
//
//   cslm_client_test HOST PORT < sentences
//
// Prints the handshake, then for every tokenized sentence on stdin one line per
// predicted word (each word, then </s>): "<natural-log prob> <flags>", scoring the
// sentence's n-grams (left-padded with <s>) through lookup() + score(), and
// checks that score_text() gives the same numbers. Exit status 0 on success.
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cslm_client.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " HOST PORT < sentences\n";
    return 2;
  }
  try {
    cslm::Client lm(argv[1], static_cast<uint16_t>(atoi(argv[2])), 30.0);
    const unsigned n = lm.order();
    std::printf("order %u vocab %u bos %u eos %u unk %u mode %u checksum %s\n", n, lm.vocab_size(), lm.bos_id(),
                lm.eos_id(), lm.unk_id(), static_cast<unsigned>(lm.info().mode), lm.checksum().c_str());

    std::string line;
    while (std::getline(std::cin, line)) {
      std::vector<std::string> words;
      std::istringstream in(line);
      for (std::string w; in >> w;) words.push_back(w);
      std::vector<uint32_t> ids = lm.lookup(words);
      ids.push_back(lm.eos_id());
      words.push_back("</s>");
      // History padded with n-1 <s>, as the model was trained.
      std::vector<uint32_t> hist(n - 1, lm.bos_id());
      std::vector<std::string> whist(n - 1, "<s>");
      std::vector<uint32_t> flat;
      std::vector<std::string> text;
      for (size_t i = 0; i < ids.size(); ++i) {
        flat.insert(flat.end(), hist.end() - (n - 1), hist.end());
        flat.push_back(ids[i]);
        std::string t;
        for (size_t j = whist.size() - (n - 1); j < whist.size(); ++j) t += whist[j] + " ";
        text.push_back(t + words[i]);
        hist.push_back(ids[i]);
        whist.push_back(words[i]);
      }
      std::vector<uint8_t> flags, tflags;
      std::vector<float> lp = lm.score(flat, n, &flags);
      std::vector<float> tlp = lm.score_text(text, &tflags);
      for (size_t i = 0; i < lp.size(); ++i) {
        // In unk mode the text form must agree exactly; in backoff mode the text
        // form may back off where the id form can only say [UNK].
        if (lm.info().mode == 0 && (lp[i] != tlp[i] || flags[i] != tflags[i])) {
          std::cerr << "score and score_text disagree at word " << i << "\n";
          return 1;
        }
        std::printf("%.6f %u\n", lp[i], static_cast<unsigned>(flags[i]));
      }
    }
    // An id outside the vocabulary is refused locally, the connection stays usable.
    std::vector<uint32_t> bad(n, lm.vocab_size());
    try {
      lm.score(bad, n);
      std::cerr << "expected invalid_argument\n";
      return 1;
    } catch (const std::invalid_argument&) {
    }
    std::string stats = lm.stats();
    if (stats.find("requests") == std::string::npos) {
      std::cerr << "stats reply lacks 'requests': " << stats << "\n";
      return 1;
    }
    std::vector<std::string> vocab = lm.vocabulary();
    if (vocab.size() != lm.vocab_size() || vocab[lm.bos_id()] != "<s>") {
      std::cerr << "vocabulary reply is inconsistent\n";
      return 1;
    }
  } catch (const cslm::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  // Connecting to a port nobody listens on fails with ConnectError.
  try {
    cslm::Client dead("127.0.0.1", 1, 2.0);
    std::cerr << "expected ConnectError\n";
    return 1;
  } catch (const cslm::ConnectError&) {
  }
  std::printf("ok\n");
  return 0;
}
