// cslm_affiliation.h -- the Moses-independent part of the joint model's feature
// (NNJM.h): which source words a target word of a phrase pair sees.
//
// A joint model (NNJM, Devlin et al. 2014) predicts target word t_j from its
// n-1 target predecessors and the m source words centred on s_{a_j}, the source
// word t_j is affiliated to. In training (cslm/data.py, `affiliations`) a_j comes
// from the sentence's word alignment; in the decoder only the phrase pair's own
// alignment is known (the target words right of the phrase are not yet chosen),
// so the same rules are applied inside each phrase pair, as Moses's
// BilingualLM (BilingualLM::getSourceWords) does:
//   * a target word aligned to one source word takes it; to several, the middle
//     one in source order, the left of the two middles of an even count
//     (BilingualLM::selectMiddleAlignment);
//   * unaligned, the affiliation of the nearest aligned target word of the
//     phrase, the right one where two are as near;
//   * a phrase pair with no alignment at all (BilingualLM stops the decoder
//     there): the source word under the target word's centre,
//     floor((2j + 1) * src_len / (2 * tgt_len)), as training does for a
//     sentence with no alignment;
//   * the closing </s> takes the source </s> (index = the sentence's length).
// This is cslm.data.affiliations applied to one phrase pair, offset by the
// phrase's source start: `cslm.data.phrase_affiliations` computes the same from
// an n-best list's segmentation and alignment, and a test compares the two.
#ifndef CSLM_MOSES_AFFILIATION_H_
#define CSLM_MOSES_AFFILIATION_H_

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace cslm {

// aligned[j]: the source indices (inside the source phrase, ascending, each
// once) that target word j of the phrase is aligned to; src_len: the source
// phrase's length (>= 1). Writes aligned.size() source indices (inside the
// source phrase) to `out`.
inline void phrase_affiliations(const std::vector<std::vector<size_t> >& aligned, size_t src_len,
                                std::vector<size_t>* out) {
  const size_t n = aligned.size();
  out->assign(n, 0);
  bool any = false;
  for (size_t j = 0; j < n; ++j) any = any || !aligned[j].empty();
  if (!any) {
    for (size_t j = 0; j < n; ++j) (*out)[j] = (2 * j + 1) * src_len / (2 * n);
    return;
  }
  for (size_t j = 0; j < n; ++j) {
    // distance d = 0, 1, ...: the right neighbour first, then the left one
    for (size_t d = 0; d < n; ++d) {
      if (j + d < n && !aligned[j + d].empty()) {
        const std::vector<size_t>& a = aligned[j + d];
        (*out)[j] = a[(a.size() - 1) / 2];
        break;
      }
      if (d <= j && !aligned[j - d].empty()) {
        const std::vector<size_t>& a = aligned[j - d];
        (*out)[j] = a[(a.size() - 1) / 2];
        break;
      }
    }
  }
}

// A sentence's source ids for its windows: m/2 <s>, the sentence, m/2 + 1 </s>.
// The window of a word affiliated to source index a (0 .. src_len, src_len
// being the source </s>) is then padded[a .. a + m).
inline void padded_source(const std::vector<uint32_t>& ids, unsigned window, uint32_t bos, uint32_t eos,
                          std::vector<uint32_t>* padded) {
  const size_t h = window / 2;
  padded->assign(h, bos);
  padded->insert(padded->end(), ids.begin(), ids.end());
  padded->insert(padded->end(), h + 1, eos);
}

// Appends one joint-model row to `out`: the n-gram's order-1 history ids, the
// window's `window` source ids, then the n-gram's predicted word
// (cslm_local.h: a row is w_1 .. w_{n-1}, s_1 .. s_m, w_n).
inline void append_joint_row(const uint32_t* ngram, unsigned order, const uint32_t* source, unsigned window,
                             std::vector<uint32_t>* out) {
  out->insert(out->end(), ngram, ngram + order - 1);
  out->insert(out->end(), source, source + window);
  out->push_back(ngram[order - 1]);
}

}  // namespace cslm

#endif  // CSLM_MOSES_AFFILIATION_H_
