"""Every error code a client can get, in one table: its HTTP status and its OpenAI shape.

The socket sends the code in an `error` event; `/api` answers that event with `status`; `/v1`
answers OpenAI's `{"error": {...}}` with the same `status`, `openai_type`, `param` and
`openai_code`. One table, so the two HTTP transports cannot disagree (docs/protocol.md, "Error
codes"; docs/openai-api.md, "Errors").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorCode:
    """How one wire error code is told to each transport's client."""

    code: str
    status: int  # HTTP status, for /api and /v1 alike
    meaning: str
    openai_type: str = "invalid_request_error"
    param: str | None = None  # the OpenAI request field at fault, when one is
    openai_code: str | None = None  # OpenAI's code when it has its own name; else `code`
    retry_after: int | None = None  # seconds, sent as Retry-After

    @property
    def openai(self) -> str:
        return self.openai_code or self.code


_SERVICE = "server_error"

ERROR_CODES: dict[str, ErrorCode] = {
    e.code: e
    for e in (
        # A frame or body the server will not act on.
        ErrorCode("bad_json", 400, "the frame or body is not JSON"),
        ErrorCode("binary_frame", 400, "a binary WebSocket frame"),
        ErrorCode("frame_too_large", 413, "a frame or body over the size limit"),
        ErrorCode("bad_frame", 400, "the frame is not a JSON object"),
        ErrorCode("unknown_type", 400, "an unknown frame type"),
        ErrorCode("bad_request_id", 400, "request_id is missing or malformed"),
        ErrorCode("bad_prompt", 400, "text is missing, empty or not Unicode"),
        ErrorCode("bad_conversation", 400, "conversation is not an id"),
        ErrorCode("bad_policy", 400, "policy is not a slug"),
        ErrorCode("bad_message", 400, "message does not name an answer that can be used so"),
        ErrorCode("bad_request", 400, "Django refused the request before the view"),
        ErrorCode(
            "bad_tools",
            400,
            "tools, tool_choice or a tool message that cannot be served (/v1)",
            param="tools",
        ),
        # HTTP only: the page's conversation API (chat/pages/chat_page.py) and the error
        # pages (chat/pages/error_pages.py) for /api and /v1 paths.
        ErrorCode("bad_query", 400, "a ?q= with a NUL"),
        ErrorCode("bad_title", 400, "a rename's body"),
        ErrorCode("bad_change", 400, "a conversation's pinned or archived that is not a boolean"),
        ErrorCode("bad_feedback", 400, "a feedback body: rating 1 or -1, an optional comment"),
        ErrorCode(
            "invalid_api_key",
            401,
            "a bearer key that is no active API key",
            openai_type="authentication_error",
        ),
        # The socket's account signed out, was deactivated or changed its password since the
        # socket opened: the one error after which the socket is closed (CLOSE_UNAUTHORISED).
        ErrorCode(
            "unauthorised",
            401,
            "the socket's sign-in has ended; it is closed",
            openai_type="authentication_error",
        ),
        ErrorCode("method_not_allowed", 405, "the endpoint takes other methods"),
        ErrorCode("forbidden", 403, "the request is not allowed", openai_type="permission_error"),
        ErrorCode("not_found", 404, "nothing at this address", openai_code="unknown_url"),
        ErrorCode(
            "prompt_too_long",
            400,
            "the prompt is over the character or token limit",
            param="messages",
            openai_code="context_length_exceeded",
        ),
        # Something named that is not the caller's, or does not exist. A policy is a named
        # resource like a conversation, and /v1 names it as a model (OpenAI's model_not_found
        # is a 404), so an unknown one is a 404 on both HTTP transports.
        ErrorCode("unknown_conversation", 404, "no such conversation of the caller's"),
        ErrorCode(
            "unknown_policy",
            404,
            "no such output policy",
            param="model",
            openai_code="model_not_found",
        ),
        ErrorCode("unknown_request", 404, "no such request or answer of the caller's"),
        # The socket's own: one answer at a time per connection.
        ErrorCode("duplicate_request_id", 400, "request_id was already used on this socket"),
        ErrorCode(
            "busy",
            400,
            "this socket's previous answer still runs (for a switch of versions: an answer of "
            "that conversation)",
        ),
        ErrorCode("csrf_failed", 403, "no or a wrong X-CSRFToken (/api only)"),
        ErrorCode(
            "rate_limited",
            429,
            "over the per-minute prompt limit",
            openai_type="requests",
            openai_code="rate_limit_exceeded",
            retry_after=60,
        ),
        # A budget of the user's or the key's is spent until its day or month resets (the
        # `error` says what is left and when): OpenAI's own name for it, so its SDK raises
        # RateLimitError with code insufficient_quota.
        ErrorCode(
            "quota_exceeded",
            429,
            "a token or answer budget is spent until it resets",
            openai_type="insufficient_quota",
            openai_code="insufficient_quota",
        ),
        # The service cannot take the prompt now; the client may send it again later. A
        # database outage is one of these (not a bug of the server's), hence 503, not 500.
        ErrorCode("model_loading", 503, "the model is still loading", openai_type=_SERVICE),
        ErrorCode("queue_full", 503, "the generation queue is full", openai_type=_SERVICE),
        ErrorCode(
            "engine_unavailable",
            503,
            "the policy's engine cannot be reached (and it has no fallback that can)",
            openai_type=_SERVICE,
            retry_after=5,
        ),
        ErrorCode("storage_failed", 503, "the database is unavailable", openai_type=_SERVICE),
        ErrorCode(
            "server_restarting",
            503,
            "the server is stopping and takes no new prompts",
            openai_type=_SERVICE,
            retry_after=5,
        ),
        ErrorCode(
            "cancel_unavailable",
            503,
            "the answer runs in another process, which cannot be reached",
            openai_type=_SERVICE,
        ),
        ErrorCode("model_error", 500, "the model failed while answering", openai_type=_SERVICE),
        ErrorCode("server_error", 500, "the server failed (error pages)", openai_type=_SERVICE),
    )
}


def error_code(code: str) -> ErrorCode:
    """The table's row for `code`; an unlisted code is a bad request (400)."""
    return ERROR_CODES.get(code) or ErrorCode(code, 400, "a bad request")
