"""What moses_rnn and cslm share: streaming text IO (textio), the run-time policy (runtime),
the model-directory format (modeldir), the training loop (trainer), vocabularies (vocab),
the error type (errors) and the command lines' helpers (cliutil).

Imports flow one way: moses_rnn -> mtcommon <- cslm. Nothing here imports either package.
"""

__version__ = "0.1.0"  # the distribution's (pyproject.toml), shown by both commands' --version
