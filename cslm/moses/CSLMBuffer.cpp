// CSLMBuffer.cpp -- see CSLMBuffer.h.
#include "CSLMBuffer.h"

#include <utility>
#include <vector>

#include <boost/unordered_map.hpp>

#include "CSLM.h"
#include "cslm_ngrams.h"
#include "moses/Bitmap.h"
#include "moses/Hypothesis.h"
#include "moses/HypothesisStack.h"
#include "moses/TranslationOptionList.h"

namespace Moses {
namespace {

const CSLM* g_feature = 0;  // set at load, before decoding starts; read-only after

struct Held {
  Hypothesis* hypo;
  float estimatedScore;
  HypothesisStack* stack;
};

// One decoder thread's held hypotheses (a thread decodes one sentence at a time).
std::vector<Held>& HeldHere() {
  static thread_local std::vector<Held> held;
  return held;
}

// One decoder thread's list of cube cells (working memory).
std::vector<std::pair<size_t, size_t> >& CellsHere() {
  static thread_local std::vector<std::pair<size_t, size_t> > cells;
  return cells;
}

// How far each cube of the stack being searched has been asked for (its corner
// size), by cube; emptied before each stack (Flush).
boost::unordered_map<const void*, size_t>& ReachHere() {
  static thread_local boost::unordered_map<const void*, size_t> reach;
  return reach;
}

// Queues the boundary n-grams of the cube's expansions (x+i, y+j), (i+1)(j+1) <= corner
// (cslm::cube_corner); returns the queue's length.
size_t QueueCorner(const std::vector<const Hypothesis*>& predecessors, const TranslationOptionList& options,
                   bool complete, size_t x, size_t y, size_t corner) {
  std::vector<std::pair<size_t, size_t> >& cells = CellsHere();
  cslm::cube_corner(x, y, predecessors.size(), options.size(), corner, &cells);
  for (size_t k = 0; k < cells.size(); ++k)
    g_feature->QueueExpansion(*predecessors[cells[k].first], *options.Get(cells[k].second), complete);
  return g_feature->Queued();
}

}  // namespace

void CSLMBuffer::Register(const CSLM* feature) { g_feature = feature; }

bool CSLMBuffer::Hold(Hypothesis* hypo, float estimatedScore, HypothesisStack* stack) {
  if (!g_feature) return false;
  Held h = {hypo, estimatedScore, stack};
  HeldHere().push_back(h);
  if (g_feature->Queue(*hypo) >= g_feature->BufferSize()) Flush();
  return true;
}

void CSLMBuffer::Flush() {
  if (!g_feature) return;
  std::vector<Held>& held = HeldHere();
  ReachHere().clear();
  g_feature->ScoreQueued();
  for (size_t i = 0; i < held.size(); ++i) {
    held[i].hypo->EvaluateWhenApplied(held[i].estimatedScore);  // every feature; the CSLM's from the cache
    held[i].stack->AddPrune(held[i].hypo);
  }
  held.clear();
}

void CSLMBuffer::Cube(const std::vector<const Hypothesis*>& predecessors, const TranslationOptionList& options,
                      const Bitmap& coverage) {
  if (!g_feature) return;
  if (QueueCorner(predecessors, options, coverage.IsComplete(), 0, 0, g_feature->Corner()) >= g_feature->BufferSize())
    g_feature->ScoreQueued();
}

void CSLMBuffer::Successors(const std::vector<const Hypothesis*>& predecessors, const TranslationOptionList& options,
                            const Bitmap& coverage, size_t x, size_t y) {
  if (!g_feature) return;
  const bool complete = coverage.IsComplete();
  const size_t before = g_feature->Queued();
  size_t queued = before;
  if (y + 1 < options.size()) queued = g_feature->QueueExpansion(*predecessors[x], *options.Get(y + 1), complete);
  if (x + 1 < predecessors.size()) queued = g_feature->QueueExpansion(*predecessors[x + 1], *options.Get(y), complete);
  if (queued == before) return;  // both successors' n-grams are known (or there are none)
  // This cube has left what was asked for it: ask for `ahead` times more of it,
  // from its corner and from (x, y) (a cube that keeps being popped soon needs all of it).
  size_t& corner = ReachHere()[&predecessors];
  if (corner == 0) corner = g_feature->Corner();
  const size_t cells_in_cube = predecessors.size() * options.size();
  corner = corner > cells_in_cube / g_feature->Ahead() ? cells_in_cube : corner * g_feature->Ahead();
  QueueCorner(predecessors, options, complete, 0, 0, corner);
  QueueCorner(predecessors, options, complete, x, y, corner);
  g_feature->ScoreQueued();
}

}  // namespace Moses
