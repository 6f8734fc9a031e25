"""The service's bearer token, read alike by the service that checks it and by the client that sends it."""

from __future__ import annotations

import os
from pathlib import Path

from tuner.common.errors import TunerError

TOKEN_ENV = "TUNER_API_TOKEN"
TOKEN_FILE_ENV = "TUNER_API_TOKEN_FILE"


def read_token(token_file: Path | None) -> str | None:
    """The bearer token: from the file if one is given (or named by TUNER_API_TOKEN_FILE), else TUNER_API_TOKEN."""
    token_file = token_file or (Path(os.environ[TOKEN_FILE_ENV]) if os.environ.get(TOKEN_FILE_ENV) else None)
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise TunerError(f"cannot read the token file {token_file}: {exc.strerror}") from None
        if not token:
            raise TunerError(f"the token file {token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None
