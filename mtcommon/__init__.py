"""What moses_rnn and cslm share: streaming text input (textio) and safe outputs (outputs), the
run-time policy (runtime), the model-directory format (modeldir), the training loop (trainer) and its checkpoints (checkpoint),
vocabularies (vocab), score strings as Moses reads them (scores), n-best lists (nbest), feature
names (features), the one finiteness check (finite), window batching (batching), the error type
(errors) and the command lines' helpers (cliutil).

Imports flow one way: moses_rnn -> mtcommon <- cslm. Nothing here imports either package.
"""

__version__ = "0.1.0"  # the distribution's (pyproject.toml), shown by both commands' --version
