"""moses-rnn: RNN Encoder-Decoder phrase scores and a CSLM for Moses (Cho et al., 2014)."""

from mtcommon import __version__  # noqa: F401  (one version for the whole distribution)
