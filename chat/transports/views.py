"""The chat page, the conversation JSON API, /healthz and /metrics."""

import hmac

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_http_methods
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..infra.runtime import runtime
from ..protocol import error_fields, inputs
from ..protocol.errors import error_code
from ..stores import branches, selectors, user_settings
from ..stores.conversations import (
    MAX_TITLE,
    BadChange,
    BadTitle,
    conversation_delete,
    conversation_mark,
    conversation_rename,
    export_json,
    export_markdown,
)
from ..stores.engine_routes import visible_policies
from .health import health, public
from .page_constants import page_constants


@require_GET
def index(request):
    owner = selectors.owner_of_request(request)
    current_id = inputs.id_parse(request.GET.get("c"))
    if current_id is not None and selectors.conversation_detail(owner, current_id) is None:
        current_id = None
    conversations = selectors.conversation_list(owner)
    # Only the policies whose engine this user may use; each names its engine.
    policies = list(
        visible_policies(owner.user_id)
        .select_related("engine")
        .only("slug", "name", "description", "is_default", "engine__name")
    )
    # A new chat starts with the user's chosen policy (settings page), else the site's default.
    start_policy = user_settings.default_policy_slug(owner) or next(
        (p.slug for p in policies if p.is_default), ""
    )
    model_name = (
        runtime.backend.model_id
        if runtime.backend
        else (settings.CHAT_MODEL_PATH or "SmolLM2-135M-Instruct")
    )
    return render(
        request,
        "chat/index.html",
        {
            "conversations": conversations,
            "current_conversation_id": current_id,
            "max_prompt_chars": settings.CHAT_MAX_PROMPT_CHARS,
            "max_title_chars": MAX_TITLE,
            "policies": policies,
            "start_policy": start_policy,
            "model_name": model_name,
            "signup_open": settings.CHAT_LOCAL_ACCOUNTS and settings.CHAT_SIGNUP != "closed",
            "local_accounts": settings.CHAT_LOCAL_ACCOUNTS,
            # What the page's modules read at start (static/chat/page/config.js).
            "chat_config": {"conversation": current_id},
            "chat_constants": page_constants(),
        },
    )


@require_GET
def conversations(request):
    """The caller's conversations; `?q=` searches their titles and message text; `?archived=1`
    lists the archived ones instead."""
    owner = selectors.owner_of_request(request)
    query = request.GET.get("q", "")[:200]
    if problem := inputs.text_problem(query):
        return _error(400, "bad_query", f"q {problem}")
    archived = request.GET.get("archived", "0") not in ("", "0", "false")
    listed = selectors.conversation_list(owner, query=query, archived=archived)
    return JsonResponse({"conversations": listed})


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_fields(code, message), status=status)


# A rename's body: a title of at most MAX_TITLE characters and little else.
MAX_TITLE_BODY = 4096


def _not_found(conversation_id: int) -> JsonResponse:
    return _error(404, "unknown_conversation", f"conversation {conversation_id} does not exist")


@require_http_methods(["GET", "PATCH", "DELETE"])
def conversation(request, conversation_id: int):
    """GET one of the caller's conversations; PATCH {"title": ..., "pinned": bool, "archived":
    bool} (any of them) renames, pins or archives it; DELETE deletes it."""
    owner = selectors.owner_of_request(request)
    if request.method == "DELETE":
        if not conversation_delete(owner=owner, conversation_id=conversation_id):
            return _not_found(conversation_id)
        return HttpResponse(status=204)
    if request.method == "PATCH":
        problem = _change(request, owner, conversation_id)
        if problem is not None:
            return problem
    detail = selectors.conversation_detail(owner, conversation_id)
    if detail is None:
        return _not_found(conversation_id)
    return JsonResponse(detail)


CHANGE_SHAPE = 'send JSON {"title": "...", "pinned": true|false, "archived": true|false}'


def _change(request, owner, conversation_id: int) -> JsonResponse | None:
    """A PATCH's changes made, or the error that refused them all (a bad body changes nothing)."""
    try:
        body = inputs.json_parse(
            inputs.body_read(request, limit=MAX_TITLE_BODY) or b"{}", limit=MAX_TITLE_BODY
        )
    except inputs.InputError as exc:
        if exc.code == inputs.TOO_LARGE:
            return _error(413, "frame_too_large", f"the body {exc.message}")
        return _error(400, "bad_title", f"{CHANGE_SHAPE}: {exc.message}")
    if not isinstance(body, dict) or not body.keys() & {"title", "pinned", "archived"}:
        return _error(400, "bad_title", CHANGE_SHAPE)
    for flag in ("pinned", "archived"):
        if flag in body and not isinstance(body[flag], bool):
            return _error(400, "bad_change", f"{flag} must be true or false")
    try:
        if "title" in body and not conversation_rename(
            owner=owner, conversation_id=conversation_id, title=body["title"]
        ):
            return _not_found(conversation_id)
        if not conversation_mark(
            owner=owner,
            conversation_id=conversation_id,
            pinned=body.get("pinned"),
            archived=body.get("archived"),
        ):
            return _not_found(conversation_id)
    except (BadTitle, BadChange) as exc:
        return _error(400, "bad_title" if isinstance(exc, BadTitle) else "bad_change", str(exc))
    return None


# A switch's body: {"message": <id>}.
MAX_BRANCH_BODY = 1024


@require_http_methods(["POST"])
def conversation_branch(request, conversation_id: int):
    """POST {"message": <id>}: show that version of a message (and, below it, the versions chosen
    there before); answers with the conversation as GET does."""
    owner = selectors.owner_of_request(request)
    try:
        body = inputs.json_parse(
            inputs.body_read(request, limit=MAX_BRANCH_BODY) or b"{}", limit=MAX_BRANCH_BODY
        )
        message = inputs.id_parse(body.get("message")) if isinstance(body, dict) else None
    except inputs.InputError as exc:
        if exc.code == inputs.TOO_LARGE:
            return _error(413, "frame_too_large", f"the body {exc.message}")
        return _error(400, "bad_message", f'send JSON {{"message": <id>}}: {exc.message}')
    if message is None:
        return _error(400, "bad_message", 'send JSON {"message": <id>}: a message id')
    try:
        chosen = branches.version_select(
            selectors.conversations_for(owner), conversation_id, message
        )
    except (branches.Busy, branches.UnknownMessage) as exc:
        code = "busy" if isinstance(exc, branches.Busy) else "bad_message"
        return _error(error_code(code).status, code, str(exc))
    if chosen is None:
        return _not_found(conversation_id)
    return JsonResponse(selectors.conversation_detail(owner, conversation_id))


EXPORTS = {
    "markdown": (export_markdown, "text/markdown; charset=utf-8", "md"),
    "json": (export_json, "application/json", "json"),
}


@require_GET
def conversation_export(request, conversation_id: int):
    """One conversation as a Markdown or JSON file (`?format=markdown|json`)."""
    kind = request.GET.get("format", "markdown")
    if kind not in EXPORTS:
        return _error(400, "bad_format", "format must be markdown or json")
    export, content_type, extension = EXPORTS[kind]
    text = export(selectors.owner_of_request(request), conversation_id)
    if text is None:
        return _not_found(conversation_id)
    response = HttpResponse(text, content_type=content_type)
    name = f"conversation-{conversation_id}.{extension}"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


METRICS_OFF = (
    "/metrics is off. Set CHAT_METRICS_TOKEN on the server and send it as "
    "'Authorization: Bearer <token>' (docs/operations.md, Metrics).\n"
)


def _bearer_matches(request, token: str) -> bool:
    """The request carries `Authorization: Bearer <token>`; compared in constant time."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics(request):
    """Prometheus text format, for a scraper holding CHAT_METRICS_TOKEN only.

    The counts are not harmless to a stranger: reused prefix tokens go up when a prompt starts
    like someone else's recent conversation, so an open /metrics would tell a probe whether
    another user's conversation begins with what it guessed. Without a token set it is off.
    """
    token = settings.CHAT_METRICS_TOKEN
    if not token:
        return HttpResponse(METRICS_OFF, status=404, content_type="text/plain; charset=utf-8")
    if not _bearer_matches(request, token):
        response = HttpResponse(
            "/metrics needs 'Authorization: Bearer <CHAT_METRICS_TOKEN>'.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@require_GET
def healthz(request):
    ready, report = health()
    shown = public(report, staff=request.user.is_active and request.user.is_staff)
    return JsonResponse(shown, status=200 if ready else 503)
