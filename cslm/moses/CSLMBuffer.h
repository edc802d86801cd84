// CSLMBuffer.h -- the search side of the paper's n-gram buffer: "a buffer was
// used to aggregate n-grams during the stack-search performed by the decoder.
// Only when the buffer is full, or a stack is about to be pruned, the n-grams
// are scored by the CSLM" (Cho et al. 2014, Sec. 4.1.2).
//
// add-to-moses.sh hooks it into Moses's normal stack search (SearchNormal,
// -search-algorithm 0) with three lines:
//   * ExpandHypothesis: a new hypothesis goes to Hold() instead of being
//     evaluated and added to its stack at once;
//   * ProcessOneStack: Flush() after the last expansion of a stack, so the
//     stacks it filled are complete before the next one is pruned and expanded.
// Cube pruning (-search-algorithm 1) is not hooked: it orders new hypotheses by
// their full score as it creates them, one or two at a time, so holding them
// would change its search; there the feature asks per hypothesis (with
// prefetch), or evaluates in process. See docs/moses-feature.md.
//
// Exactness: a held hypothesis is evaluated with every feature (the CSLM's
// n-grams then come from the cache the flush filled) and added to its stack
// with AddPrune at the flush, in the order it was created. Nothing reads those
// stacks before the flush (the search expands stack i into stacks > i), so the
// stacks, their pruning and recombination are those of the unbuffered search.
// Early discarding (-early-discarding-threshold) reads them, so the buffer is
// off when it is on.
#ifndef MOSES_FF_CSLM_BUFFER_H_
#define MOSES_FF_CSLM_BUFFER_H_

namespace Moses {

class CSLM;
class Hypothesis;
class HypothesisStack;

class CSLMBuffer {
 public:
  // Called by the CSLM feature at load when it buffers (buffer=N > 0).
  static void Register(const CSLM* feature);
  // A new hypothesis, not yet evaluated. Returns false when no CSLM feature
  // buffers: the search evaluates and adds it as usual. Returns true when it is
  // held: it is evaluated and added to `stack` at the next flush, which happens
  // here when the queued n-grams reach the buffer's size.
  static bool Hold(Hypothesis* hypo, float estimatedScore, HypothesisStack* stack);
  // Scores the queued n-grams (one request, or a few of the buffer's size),
  // then evaluates the held hypotheses and adds them to their stacks in order.
  static void Flush();
};

}  // namespace Moses

#endif  // MOSES_FF_CSLM_BUFFER_H_
