// CSLMBuffer.cpp -- see CSLMBuffer.h.
#include "CSLMBuffer.h"

#include <vector>

#include "CSLM.h"
#include "moses/Hypothesis.h"
#include "moses/HypothesisStack.h"

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
  g_feature->ScoreQueued();
  for (size_t i = 0; i < held.size(); ++i) {
    held[i].hypo->EvaluateWhenApplied(held[i].estimatedScore);  // every feature; the CSLM's from the cache
    held[i].stack->AddPrune(held[i].hypo);
  }
  held.clear();
}

}  // namespace Moses
