"""moses-rnn: RNN Encoder-Decoder phrase scores and a CSLM for Moses (Cho et al., 2014)."""

__version__ = "0.1.0"
