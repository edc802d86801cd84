"""Training a phrase model on the phrase pairs of a Moses table (train), on mtcommon's loop."""
