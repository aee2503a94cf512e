"""The product's own error responses (handler400/403/404/500 in project/urls.py).

Whatever went wrong, a stranger learns nothing about the server: no exception text, no path
of a template, no settings. API clients get their own error shape instead of a page: `/api/`
the wire protocol's `error` event (docs/protocol.md), `/v1/` OpenAI's error object
(docs/openai-api.md). With DEBUG on Django shows its debug pages for 404 and 500 instead.
"""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, JsonResponse
from django.template import loader

from ..protocol import error_fields
from ..protocol.errors import error_code
from ..transports.openai import error_body

log = logging.getLogger(__name__)

# status -> (page heading, what it means to the visitor, the wire error code). The code's row in
# the one table (chat/protocol/errors.py) gives its OpenAI type and code for /v1.
ERRORS = {
    400: ("Bad request", "The request was refused.", "bad_request"),
    403: ("Forbidden", "You may not open this page.", "forbidden"),
    404: ("Not found", "There is nothing at this address.", "not_found"),
    413: ("Too large", "The request is too large.", "frame_too_large"),
    500: (
        "Something went wrong",
        "The server could not answer. The error was logged; try again in a moment.",
        "server_error",
    ),
}


def error_response(request, status: int, detail: str = "") -> HttpResponse:
    """The error `status` in the shape the path's clients read; `detail` is safe to show."""
    heading, meaning, code = ERRORS[status]
    message = detail or meaning
    path = getattr(request, "path", "") or ""
    if path == "/v1" or path.startswith("/v1/"):
        row = error_code(code)
        body = error_body(message, type=row.openai_type, code=row.openai_code)
        return JsonResponse(body, status=status)
    if path.startswith("/api/"):
        return JsonResponse(error_fields(code, message), status=status)
    try:
        page = loader.get_template("errors/page.html").render(
            {"status": status, "heading": heading, "message": message}
        )
    except Exception:  # the error page must never raise in its turn
        log.exception("the %s page could not be rendered", status)
        page = f"<!doctype html><title>{status}</title><h1>{heading}</h1><p>{meaning}</p>"
    return HttpResponse(page, status=status)


def bad_request(request, exception=None):
    """handler400: a request Django refused before the view (a body over
    DATA_UPLOAD_MAX_MEMORY_SIZE that the CSRF check read, a Host not in ALLOWED_HOSTS)."""
    if isinstance(exception, RequestDataTooBig):
        return error_response(request, 413, "the request body is too large")
    return error_response(request, 400)


def permission_denied(request, exception=None):
    """handler403; a PermissionDenied raised with a message for the visitor shows it."""
    detail = str(exception) if exception is not None and exception.args else ""
    return error_response(request, 403, detail)


def page_not_found(request, exception=None):  # noqa: ARG001 (Django's signature)
    """handler404: never echoes the path or the resolver's message."""
    return error_response(request, 404)


def server_error(request):
    """handler500: the exception was logged by Django; the client learns nothing of it."""
    return error_response(request, 500)
