"""The project's own error type: something the user gave it is wrong, not the code.

Every error the project raises about a user's input, files, options or
environment is a `UserError` (`textio.InputError`, `mosesini.IniError`,
`modeldir.ModelError`, ...); the command lines show it in one line, without a
traceback (`cliutil.fail_cleanly`). Any other exception is a bug and keeps
its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input, a bad option or a damaged file: the message says what and where, in one line.

    A ValueError, as InputError and IniError always were, so callers that catch
    ValueError (pipelines/mt.py) keep working.
    """
