"""The one exception type users see as a single line (the CLI maps it; `--debug` shows the traceback)."""


class SpeccliError(Exception):
    """A problem the user can fix: the message names the thing and what is wrong with it."""

    exit_code = 1


class UnreadableFileError(SpeccliError):
    """A model or config file that is missing, not readable, or not what it claims to be."""

    exit_code = 2
