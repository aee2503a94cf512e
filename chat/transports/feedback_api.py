"""`POST /api/messages/<id>/feedback`: a thumbs up or down, with an optional comment, on one of
the caller's answers; `DELETE` takes it back (docs/protocol.md, "Feedback").

The caller is the session (the page: CSRF applies, as on the rest of /api/) or an API key
(`Authorization: Bearer sk-...`, which carries no cookie, so CSRF does not apply). Someone
else's answer, or none, is a 404, so nobody can rate another's answer or learn it exists.
"""

from __future__ import annotations

import math

from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from ..infra.ratelimit import feedback_limiter
from ..protocol import error_fields, inputs
from ..protocol.errors import error_code
from ..stores import apikeys, feedback
from ..stores.selectors import Owner, owner_of_api_key, owner_of_request

MAX_BODY = 8192
BODY_SHAPE = 'send JSON {"rating": 1 | -1, "comment": "..."} (DELETE takes a rating back)'


def _error(code: str, message: str) -> JsonResponse:
    return JsonResponse(error_fields(code, message), status=error_code(code).status)


class BadBody(Exception):
    pass


def feedback_parse(body: bytes) -> tuple[int, str]:
    """The rating and comment of a feedback body; BadBody with what is wrong."""
    try:
        value = inputs.json_parse(body or b"", limit=MAX_BODY)
    except inputs.InputError as exc:
        where = "" if exc.code == inputs.BAD_TEXT else "the body "
        raise BadBody(f"{where}{exc.message}; {BODY_SHAPE}") from None
    if not isinstance(value, dict):
        raise BadBody(f"the body is not a JSON object; {BODY_SHAPE}")
    unknown = sorted(set(value) - {"rating", "comment"})
    if unknown:
        raise BadBody(f"unknown field {unknown[0]!r}; {BODY_SHAPE}")
    rating = value.get("rating")
    if rating == 0 and not isinstance(rating, bool):
        raise BadBody("rating 0 is not a rating: send DELETE to take a rating back")
    if isinstance(rating, bool) or rating not in (feedback.UP, feedback.DOWN):
        raise BadBody(f"rating must be 1 (thumbs up) or -1 (thumbs down); {BODY_SHAPE}")
    comment = value.get("comment", "")
    if comment is None:
        comment = ""
    if not isinstance(comment, str):
        raise BadBody("comment must be a string")
    comment = comment.strip()
    if len(comment) > feedback.MAX_COMMENT:
        raise BadBody(f"comment is over {feedback.MAX_COMMENT} characters")
    return int(rating), comment


def _owner(request) -> Owner | JsonResponse:
    """The API key's user when the request carries one, else the session's owner."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return owner_of_request(request)
    try:
        row = apikeys.apikey_check(key.strip())
    except apikeys.KeyRefused as refused:
        response = _error("invalid_api_key", str(refused))
        response["WWW-Authenticate"] = "Bearer"
        return response
    return owner_of_api_key(row)


@csrf_protect
def _rate_with_session(request, message_id: int):
    return _rate(request, message_id)


def _rate(request, message_id: int):
    owner = _owner(request)
    if isinstance(owner, JsonResponse):
        return owner
    wait = feedback_limiter.check(owner.rate_key)
    if wait:
        seconds = math.ceil(wait)
        response = _error(
            "rate_limited",
            f"too many ratings: at most {feedback_limiter.limit} {feedback_limiter.per}; "
            f"try again in {seconds} s",
        )
        response["Retry-After"] = str(seconds)
        return response
    try:
        if request.method == "DELETE":
            feedback.rating_clear(owner=owner, message_id=message_id)
            return HttpResponse(status=204)
        try:
            rating, comment = feedback_parse(inputs.body_read(request, limit=MAX_BODY))
        except inputs.InputError as exc:
            return _error("frame_too_large", f"the body {exc.message}")
        except BadBody as exc:
            return _error("bad_feedback", str(exc))
        rated = feedback.rating_set(
            owner=owner, message_id=message_id, rating=rating, comment=comment
        )
    except feedback.FeedbackRefused as exc:
        return _error(exc.code, exc.message)
    return JsonResponse(rated.wire())


@csrf_exempt  # checked below for a session; a bearer key carries no cookie to forge
def message_feedback(request, message_id: int):
    """POST sets or changes the caller's rating of their answer; DELETE takes it back."""
    if request.method not in ("POST", "DELETE"):
        response = _error("method_not_allowed", "use POST to rate an answer, DELETE to un-rate it")
        response["Allow"] = "POST, DELETE"
        return response
    if request.headers.get("Authorization", "").lower().startswith("bearer "):
        return _rate(request, message_id)
    return _rate_with_session(request, message_id)
