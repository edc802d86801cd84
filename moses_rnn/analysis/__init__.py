"""The paper's qualitative analysis (analyze) and RNNsearch's soft alignments (align)."""
