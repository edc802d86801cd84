"""Target phrases from a trained model: sampling and beam search (generate)."""
