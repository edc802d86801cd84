"""The phrase models: their base and interface (modelbase), the RNN Encoder-Decoder (model),
RNNsearch (rnnsearch), and a phrase model's directory (modelio)."""

#: The architectures, by the name `--arch` and a config.json use, each with the name the
#: literature gives it (Bahdanau et al.'s, which reports show): each has its presets
#: (`modelbase.PRESETS_BY_ARCH`) and its class (`modelio.ARCHITECTURES`). Here, without torch, for the CLI.
ARCH_TITLES = {"encdec": "RNNencdec", "rnnsearch": "RNNsearch"}
ARCHS = tuple(ARCH_TITLES)
