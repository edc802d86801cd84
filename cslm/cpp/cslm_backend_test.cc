// cslm_backend_test -- scores n-grams through a cslm::Backend, as the Moses
// feature does, for the test suite.
//
//   cslm_backend_test [--floor F] [--self-normalized auto|true|false] MODEL_DIR < NGRAMS
//   cslm_backend_test [--floor F] [--retries N] --server HOST PORT [MODEL_DIR] < NGRAMS
//
// One n-gram per line (up to order words, oldest first; fewer are left-padded
// with <s>; a joint model's rows whole, as cslm_local_test reads them); prints "LOGPROB FLAGS" per line; on stderr, a line once the
// backend is ready (before stdin is read), then "requests R".
// Errors: one line on stderr, exit status 1.
#include <stdio.h>
#include <stdlib.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cslm_backend.h"
#include "cslm_test_input.h"

int main(int argc, char** argv) {
  float floor = -100.0f;
  int self_normalized = -1, retries = 1;
  std::string host, model_dir;
  int port = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--floor" && i + 1 < argc) {
      floor = static_cast<float>(atof(argv[++i]));
    } else if (a == "--self-normalized" && i + 1 < argc) {
      const std::string v = argv[++i];
      self_normalized = v == "auto" ? -1 : v == "true";
    } else if (a == "--retries" && i + 1 < argc) {
      retries = atoi(argv[++i]);
    } else if (a == "--server" && i + 2 < argc) {
      host = argv[++i];
      port = atoi(argv[++i]);
    } else {
      model_dir = a;
    }
  }
  if (port < 0 && model_dir.empty()) {
    std::cerr << "usage: cslm_backend_test [--floor F] [--self-normalized auto|true|false] "
                 "[--retries N] [--server HOST PORT] [MODEL_DIR] < NGRAMS"
              << std::endl;
    return 2;
  }
  try {
    std::unique_ptr<cslm::Backend> backend;
    if (port < 0)
      backend.reset(new cslm::LocalBackend(model_dir, self_normalized, 4096, floor));
    else
      backend.reset(new cslm::ServerBackend(host, static_cast<uint16_t>(port), 10.0, retries, floor, model_dir,
                                            &std::cerr, "cslm_backend_test"));
    const cslm::ModelFacts& facts = backend->facts();
    std::cerr << "model " << backend->Where() << ": order " << facts.order << ", " << facts.words.size() << " words"
              << std::endl;
    std::vector<uint32_t> flat;
    std::string error;
    const size_t count =
        facts.source_window
            ? cslm::ReadJointRows(std::cin, facts.words, facts.source_words, facts.order, facts.source_window, &flat,
                                  &error)
            : cslm::ReadNgrams(std::cin, facts.words, facts.order, facts.bos, facts.unk, &flat, &error);
    if (!error.empty()) {
      std::cerr << error << std::endl;
      return 1;
    }
    std::unique_ptr<cslm::Backend::Session> session(backend->NewSession());
    std::vector<float> lp(count);
    std::vector<uint8_t> flags(count);
    if (count) session->Evaluate(&flat[0], count, &lp[0], &flags[0]);
    for (size_t i = 0; i < count; ++i) printf("%.6f %u\n", lp[i], static_cast<unsigned>(flags[i]));
    std::cerr << "requests " << session->requests << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
