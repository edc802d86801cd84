"""The `moses-rnn` subcommands, one module per job: train, score (tables and n-best lists), ini (moses.ini
edits), generate (sample, translate, augment) and analyze (the paper's tables and figures, alignments).
Each command only wires a library API; `moses_rnn.cli` gathers them into the `moses-rnn` group."""
