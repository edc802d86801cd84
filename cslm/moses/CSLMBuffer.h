// CSLMBuffer.h -- the search side of the paper's n-gram buffer: "a buffer was
// used to aggregate n-grams during the stack-search performed by the decoder.
// Only when the buffer is full, or a stack is about to be pruned, the n-grams
// are scored by the CSLM" (Cho et al. 2014, Sec. 4.1.2).
//
// Normal stack search (-search-algorithm 0): add-to-moses.sh hooks it into
// moses/SearchNormal.cpp with three lines:
//   * ExpandHypothesis: a new hypothesis goes to Hold() instead of being
//     evaluated and added to its stack at once;
//   * ProcessOneStack: Flush() after the last expansion of a stack, so the
//     stacks it filled are complete before the next one is pruned and expanded.
// Exactness: a held hypothesis is evaluated with every feature (the CSLM's
// n-grams then come from the cache the flush filled) and added to its stack
// with AddPrune at the flush, in the order it was created. Nothing reads those
// stacks before the flush (the search expands stack i into stacks > i), so the
// stacks, their pruning and recombination are those of the unbuffered search.
// Early discarding (-early-discarding-threshold) reads them, so the buffer is
// off when it is on.
//
// Cube pruning (-search-algorithm 1): cube pruning orders new hypotheses by
// their full score as it creates them, one or two at a time, so nothing can be
// held. The buffer asks ahead instead: add-to-moses.sh hooks three calls into
// moses/BitmapContainer.cpp and moses/SearchCubePruning.cpp:
//   * Cube(): a cube is built (a BackwardsEdge: the predecessors, sorted best
//     first, times the options of one source span, best first) for a later
//     stack. With predict=P > 0 (the default, 1.25) it is kept until the flush
//     before that stack; with predict=0 the boundary n-grams of its first
//     expansions, those at (x, y) with (x+1)(y+1) <= corner, join the queue.
//   * Flush(): before a stack's cubes are initialised. With predict=P, the
//     stack's cube pruning is run ahead (cslm::cube_run) for P times its pop
//     limit, and every cell that run creates joins the queue. With
//     run-ahead=evaluate (the default) a cell scores what the search will
//     score it: the hypothesis it would make is made and evaluated with every
//     feature, the CSLM's n-grams from the cache, and an n-gram the cache
//     lacks is queued and given a provisional value (the mean of those
//     answered so far that end in the same words, cslm::SuffixMeans); with
//     rounds=N > 1 (default 1), N runs, each after the last one's queue is
//     scored, so that each round scores more cells exactly. With
//     run-ahead=estimate a cell's score is its predecessor's score + its
//     option's future score + the future cost of its coverage + the
//     distortion cost, without the other stateful features' boundary costs.
//     The queue is scored: one request per round, or per buffer= n-grams.
//   * Successors(): when a cube is about to create the successors of its
//     popped expansion (x, y) and one of them lacks an n-gram, the search has
//     left what was asked for that cube: its reach grows `ahead` times (corner,
//     corner*ahead, corner*ahead^2, ... capped at the whole cube), and the
//     expansions under the new reach, both from the cube's corner and from
//     (x, y), are queued and scored at once: one request for the next several
//     pops of that cube. A cube that is popped a lot thus costs a few requests
//     (logarithmic in its size), one popped once costs none.
// Exactness: nothing is held or reordered: every hypothesis is evaluated where
// and when cube pruning evaluates it; the buffer only fills the cache first,
// with the values the same server would return for the same n-grams.
#ifndef MOSES_FF_CSLM_BUFFER_H_
#define MOSES_FF_CSLM_BUFFER_H_

#include <stddef.h>

#include <vector>

namespace Moses {

class Bitmap;
class CSLM;
class Hypothesis;
class HypothesisStack;
class TranslationOptionList;

class CSLMBuffer {
 public:
  // Called by the CSLM feature at load when it buffers (buffer=N > 0).
  static void Register(const CSLM* feature);
  // Normal search: a new hypothesis, not yet evaluated. Returns false when no
  // CSLM feature buffers: the search evaluates and adds it as usual. Returns
  // true when it is held: it is evaluated and added to `stack` at the next
  // flush, which happens here when the queued n-grams reach the buffer's size.
  static bool Hold(Hypothesis* hypo, float estimatedScore, HypothesisStack* stack);
  // Scores the queued n-grams (one request, or a few of the buffer's size),
  // then evaluates the held hypotheses (normal search) and adds them to their
  // stacks in order. Does nothing when no CSLM feature buffers.
  static void Flush();
  // Cube pruning: a new cube of `predecessors` (sorted as the cube sorts them)
  // times `options` (best first); `coverage` is the coverage of every
  // expansion. Queues the n-grams of its corner (see above); with predict=,
  // keeps the cube for the flush before its stack instead.
  static void Cube(const std::vector<const Hypothesis*>& predecessors, const TranslationOptionList& options,
                   const Bitmap& coverage);
  // Cube pruning: the cube is about to create the successors of (x, y). If
  // either lacks an n-gram, grows the cube's reach `ahead` times, queues the
  // n-grams of the expansions under it (from (0, 0) and from (x, y)) and scores
  // the queue (one request).
  static void Successors(const std::vector<const Hypothesis*>& predecessors, const TranslationOptionList& options,
                         const Bitmap& coverage, size_t x, size_t y);
  // The sentence is decoded (the feature's CleanUpAfterSentenceProcessing):
  // forgets this thread's cubes.
  static void EndSentence();
};

}  // namespace Moses

#endif  // MOSES_FF_CSLM_BUFFER_H_
