"""Why a turn was refused before it started."""

from __future__ import annotations

from ..protocol.events import Error


class TurnError(Exception):
    """A turn refused before it started; `code` and `message` go to the client as `error`, with
    `left` and `resets_at` for a spent budget (`quota_exceeded`)."""

    def __init__(
        self, code: str, message: str, *, left: dict | None = None, resets_at: str | None = None
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.left = left
        self.resets_at = resets_at

    def event(self, request_id: str | None) -> Error:
        """The `error` event a transport sends for this refusal."""
        return Error(request_id, self.code, self.message, left=self.left, resets_at=self.resets_at)
