// cslm_local_test -- scores n-grams with cslm::LocalModel, for the test suite
// and benchmarks/bench_cslm_decode.py.
//
//   cslm_local_test MODEL_DIR < NGRAMS          one n-gram per line (order words,
//       oldest first, fewer are left-padded with <s>); prints per line
//       "EXACT SELFNORM": ln P(w | h) with the softmax, and o_w alone.
//       A joint model (source window m > 0) reads whole rows instead: each line
//       order-1 target words, m source words, the predicted target word, with
//       <s>/</s> padding written out (ReadJointRows in cslm_test_input.h).
//   cslm_local_test MODEL_DIR --bench SECONDS < NGRAMS
//       scores the n-grams over and over for about SECONDS per mode; prints
//       "selfnorm NGRAMS_PER_S" and "exact NGRAMS_PER_S".
//   --precision fp32|int8 (before --bench) loads the model in that precision
//       (cslm_local.h, "Precision").
#include <stdio.h>
#include <stdlib.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "cslm_local.h"
#include "cslm_test_input.h"

int main(int argc, char** argv) {
  cslm::Precision precision = cslm::kFloat32;
  double seconds = 0;  // 0: score once and print
  bool ok = argc >= 2;
  for (int i = 2; ok && i < argc; i += 2) {
    const std::string flag = argv[i];
    ok = i + 1 < argc && ((flag == "--precision" && cslm::ParsePrecision(argv[i + 1], &precision)) ||
                          (flag == "--bench" && (seconds = atof(argv[i + 1])) > 0));
  }
  if (!ok) {
    std::cerr << "usage: cslm_local_test MODEL_DIR [--precision fp32|int8] [--bench SECONDS] < NGRAMS" << std::endl;
    return 2;
  }
  try {
    cslm::LocalModel lm(argv[1], precision);
    std::vector<uint32_t> flat;
    std::string error;
    const size_t count =
        lm.source_window()
            ? cslm::ReadJointRows(std::cin, lm.vocabulary(), lm.source_vocabulary(), lm.order(), lm.source_window(),
                                  &flat, &error)
            : cslm::ReadNgrams(std::cin, lm.vocabulary(), lm.order(), lm.bos_id(), lm.unk_id(), &flat, &error);
    if (!error.empty()) {
      std::cerr << error << std::endl;
      return 1;
    }
    cslm::LocalModel::Scratch scratch;
    if (seconds == 0) {
      std::vector<float> exact(count), selfnorm(count);
      if (count) {
        lm.Score(&flat[0], count, true, &exact[0], &scratch);
        lm.Score(&flat[0], count, false, &selfnorm[0], &scratch);
      }
      for (size_t i = 0; i < count; ++i) printf("%.6f %.6f\n", exact[i], selfnorm[i]);
      std::cerr << "self-normalized " << (lm.self_normalized() ? 1 : 0) << std::endl;  // what Moses's feature defaults to
      std::cerr << "kernels " << cslm::LocalModel::Kernels() << std::endl;
      return 0;
    }
    std::vector<float> out(count);
    for (int mode = 0; mode < 2 && count; ++mode) {
      const bool normalized = mode == 1;
      size_t done = 0;
      const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
      double elapsed = 0;
      while (elapsed < seconds) {
        lm.Score(&flat[0], count, normalized, &out[0], &scratch);
        done += count;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      printf("%s %.1f\n", normalized ? "exact" : "selfnorm", done / elapsed);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
