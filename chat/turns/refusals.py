"""Why a turn was refused before it started."""

from __future__ import annotations


class TurnError(Exception):
    """A turn refused before it started; `code` and `message` go to the client as `error`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message
