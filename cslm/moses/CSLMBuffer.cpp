// CSLMBuffer.cpp -- see CSLMBuffer.h.
#include "CSLMBuffer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <boost/unordered_map.hpp>

#include "CSLM.h"
#include "cslm_ngrams.h"
#include "moses/Bitmap.h"
#include "moses/FF/DistortionScoreProducer.h"
#include "moses/Hypothesis.h"
#include "moses/HypothesisStack.h"
#include "moses/Manager.h"
#include "moses/SquareMatrix.h"
#include "moses/StaticData.h"
#include "moses/TranslationOptionCollection.h"
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

// predict=: a cube built for a later stack, kept until the flush before that
// stack (the cube's vectors live as long as the sentence's search).
struct PendingCube {
  const std::vector<const Hypothesis*>* predecessors;
  const TranslationOptionList* options;
  const Bitmap* coverage;  // of every expansion (its BitmapContainer's, alive as long as the search)
  bool complete;
  size_t stack;     // words its expansions cover: the stack they go to
  float estimate;   // the future-cost estimate of that coverage
};

// One decoder thread's pending cubes, and working memory for their scores and
// the cells the run-ahead creates. Emptied at the end of each sentence.
struct Prediction {
  Prediction() : manager(0), pop_limit(0) {}
  const Manager* manager;  // the sentence the pending cubes belong to
  size_t pop_limit;        // ... and its cube pruning pop limit
  std::vector<PendingCube> pending;
  std::vector<float> scores;
  std::vector<cslm::CubeEstimate> cubes;
  std::vector<cslm::CubeCell> cells;
};

// True for a pending cube of another stack than `stack`.
struct OtherStack {
  explicit OtherStack(size_t s) : stack(s) {}
  bool operator()(const PendingCube& c) const { return c.stack != stack; }
  size_t stack;
};

Prediction& PredictionHere() {
  static thread_local Prediction prediction;
  return prediction;
}

// The weighted distortion cost of translating `span` after `pred`, as the
// distortion features will add it (DistortionScoreProducer::EvaluateWhenApplied):
// the one boundary cost known before any scoring. All the options of a cube
// cover one span, so within a cube it varies with the predecessor alone.
float DistortionCost(const Hypothesis& pred, const Range& span) {
  const std::vector<const DistortionScoreProducer*>& features =
      DistortionScoreProducer::GetDistortionFeatureFunctions();
  float cost = 0;
  for (size_t i = 0; i < features.size(); ++i)
    cost += StaticData::Instance().GetWeight(features[i]) *
            DistortionScoreProducer::CalculateDistortionScore(pred, pred.GetCurrSourceWordsRange(), span,
                                                              pred.GetWordsBitmap().GetFirstGapPos());
  return cost;
}

// A cell's score in the run ahead with every feature (run-ahead=evaluate):
// the future score of the hypothesis the cell would make, made as
// BackwardsEdge::CreateHypothesis makes it (but with id 0, so that the real
// search's ids are unchanged), evaluated with the CSLM in its run-ahead mode
// (unknown n-grams queued, a provisional value in their place), then dropped.
// With rounds > 1, a cell whose n-grams were all known keeps its score for
// the later rounds.
class EvaluatedScore {
 public:
  EvaluatedScore(const PendingCube* cubes, bool keep) : m_cubes(cubes), m_keep(keep) {}
  float operator()(size_t c, size_t x, size_t y) {
    const uint64_t key = cslm::cell_key(c, x, y);
    if (m_keep) {
      boost::unordered_map<uint64_t, float>::const_iterator known = m_exact.find(key);
      if (known != m_exact.end()) return known->second;
    }
    const PendingCube& cube = m_cubes[c];
    const size_t before = g_feature->RunAheadMisses();
    Hypothesis hypo(*(*cube.predecessors)[x], *cube.options->Get(y), *cube.coverage, 0);
    hypo.EvaluateWhenApplied(cube.estimate);
    const float score = hypo.GetFutureScore();
    if (m_keep && g_feature->RunAheadMisses() == before) m_exact[key] = score;
    return score;
  }

 private:
  const PendingCube* m_cubes;
  bool m_keep;  // another round follows
  boost::unordered_map<uint64_t, float> m_exact;
};

// Queues what cube pruning will create in the next stack, run ahead (cslm::cube_run):
// the pending cubes of the lowest stack, predict x the pop limit pops. Those
// cubes leave the pending list. With run-ahead=evaluate, the run is repeated
// up to rounds= times, each round's unknown n-grams scored before the next
// (whose cells then score as the search will score them); the last round's
// are left queued for the flush.
void QueuePredicted() {
  Prediction& p = PredictionHere();
  if (p.pending.empty()) return;
  size_t stack = p.pending[0].stack;
  for (size_t i = 1; i < p.pending.size(); ++i) stack = std::min(stack, p.pending[i].stack);
  // the next stack's cubes to the end, in the order they were built (the run-ahead is deterministic)
  const std::vector<PendingCube>::iterator mine =
      std::stable_partition(p.pending.begin(), p.pending.end(), OtherStack(stack));
  const size_t pops = static_cast<size_t>(g_feature->Predict() * p.pop_limit + 0.5);
  if (g_feature->EvaluateRunAhead()) {
    std::vector<std::pair<size_t, size_t> > sizes;
    for (std::vector<PendingCube>::iterator c = mine; c != p.pending.end(); ++c)
      sizes.push_back(std::make_pair(c->predecessors->size(), c->options->size()));
    EvaluatedScore score(&*mine, g_feature->Rounds() > 1);
    for (size_t round = 0; round < g_feature->Rounds(); ++round) {
      if (round > 0) g_feature->ScoreQueued();  // what the last round did not know
      g_feature->RunAhead(true);
      cslm::cube_run(sizes, pops, score, &p.cells);
      g_feature->RunAhead(false);
      if (!g_feature->Queued()) break;  // every cell it made was known: the next round would repeat it
    }
    p.pending.erase(mine, p.pending.end());
    return;
  }
  size_t values = 0;
  for (std::vector<PendingCube>::iterator c = mine; c != p.pending.end(); ++c)
    values += c->predecessors->size() + c->options->size();
  p.scores.resize(values);  // not reallocated below: the CubeEstimates point into it
  p.cubes.clear();
  float* at = p.scores.empty() ? 0 : &p.scores[0];
  for (std::vector<PendingCube>::iterator c = mine; c != p.pending.end(); ++c) {
    cslm::CubeEstimate e = {at, c->predecessors->size(), at + c->predecessors->size(), c->options->size(),
                            c->estimate};
    const Range& span = c->options->Get(0)->GetSourceWordsRange();
    for (size_t x = 0; x < e.nx; ++x) {
      const Hypothesis& pred = *(*c->predecessors)[x];
      at[x] = pred.GetScore() + DistortionCost(pred, span);
    }
    for (size_t y = 0; y < e.ny; ++y) at[e.nx + y] = c->options->Get(y)->GetFutureScore();
    at += e.nx + e.ny;
    p.cubes.push_back(e);
  }
  cslm::cube_pops(p.cubes, pops, &p.cells);
  for (size_t k = 0; k < p.cells.size(); ++k) {
    const PendingCube& c = mine[p.cells[k].cube];
    g_feature->QueueExpansion(*(*c.predecessors)[p.cells[k].x], *c.options->Get(p.cells[k].y), c.complete);
  }
  p.pending.erase(mine, p.pending.end());
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
  if (g_feature->Predict() > 0) QueuePredicted();
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
  if (g_feature->Predict() > 0) {  // asked for at the flush before its stack, with the stack's other cubes
    if (predecessors.empty() || options.size() == 0) return;  // cube pruning creates nothing from it
    Manager& manager = predecessors[0]->GetManager();
    Prediction& p = PredictionHere();
    if (p.manager != &manager) {  // a new sentence: what an earlier one left is gone with its search
      p.pending.clear();
      p.manager = &manager;
      p.pop_limit = manager.options()->cube.pop_limit;
    }
    PendingCube c = {&predecessors, &options, &coverage, coverage.IsComplete(), coverage.GetNumWordsCovered(),
                     manager.getSntTranslationOptions()->GetEstimatedScores().CalcEstimatedScore(coverage)};
    p.pending.push_back(c);
    return;
  }
  if (QueueCorner(predecessors, options, coverage.IsComplete(), 0, 0, g_feature->Corner()) >= g_feature->BufferSize())
    g_feature->ScoreQueued();
}

void CSLMBuffer::EndSentence() {
  Prediction& p = PredictionHere();
  p.pending.clear();  // a search stopped early (out of time) leaves cubes that die with it
  p.manager = 0;
  ReachHere().clear();
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
