"""Errors a user can act on: the CLI prints them as one line and exits 2."""


class TunerError(Exception):
    """Bad input or a condition the user must fix; its message is shown as is."""


class NotFound(TunerError):
    """A study, run or schedule that does not exist (the service answers 404)."""


class TraceFormatError(TunerError):
    """A trace file that cannot be read, with the file and line it failed at."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path, self.line = path, line
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
