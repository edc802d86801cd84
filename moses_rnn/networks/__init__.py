"""The phrase models: their base and interface (modelbase), the RNN Encoder-Decoder (model),
RNNsearch (rnnsearch), and a phrase model's directory (modelio)."""
