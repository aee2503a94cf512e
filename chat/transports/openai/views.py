"""The OpenAI-compatible API, for the clients people already have (the `openai` packages,
LangChain's ChatOpenAI, Open WebUI):

- `GET /v1/models`: the default policy as `<CHAT_API_MODEL_NAME>`, every stored policy as
  `<CHAT_API_MODEL_NAME>:<slug>`.
- `POST /v1/chat/completions`, `stream` true (server-sent `chat.completion.chunk`s ending with
  `data: [DONE]`) or false (one `chat.completion`).

Callers authenticate with a per-user key (`Authorization: Bearer sk-...`, chat/stores/apikeys.py), so
CSRF does not apply. Each request is one chat turn through chat/turns/, like the page's:
the same queue, cache, policy gate, storage, metrics and rate limit (the key's user's). Closing
the connection cancels the turn within one decode step. Wire shapes, requests and replies:
the other modules of this package.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from ... import turns
from ...models import ApiKey
from ...protocol import Prompt, events, inputs
from ...stores import apikeys
from ...stores.engine_routes import visible_policies
from ...stores.selectors import owner_of_api_key
from ..feed import KEEPALIVE, TurnFeed
from ..sse import sse_response
from . import (
    MAX_BODY_BYTES,
    ChatRequest,
    Delta,
    ModelObject,
    OpenAIError,
    answer_of,
    chunk,
    completion,
    input_error,
    model_list,
    model_object,
    parse_chat_request,
    tool_call_deltas,
    turn_error,
    usage_of,
)

log = logging.getLogger(__name__)


def _error_response(exc: OpenAIError) -> JsonResponse:
    response = JsonResponse(exc.body(), status=exc.status)
    if exc.status == 429:
        response["Retry-After"] = "60"
    for name, value in exc.headers.items():
        response[name] = value
    if exc.status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


def _method_not_allowed(method: str) -> JsonResponse:
    return _error_response(
        OpenAIError(405, f"use {method} for this endpoint", code="method_not_allowed")
    )


async def _authenticate(request) -> ApiKey:
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise OpenAIError(
            401,
            "You didn't provide an API key: send `Authorization: Bearer <key>`; "
            "make one at /account/api-keys/",
            code="invalid_api_key",
        )
    try:
        return await sync_to_async(apikeys.apikey_check)(key.strip())
    except apikeys.KeyRefused as refused:
        raise OpenAIError(401, str(refused), code="invalid_api_key") from None


def _models(user_id: int | None) -> list[ModelObject]:
    name = settings.CHAT_API_MODEL_NAME
    # Only what the key's user may use: a policy on another group's engine is not theirs.
    policies = list(
        visible_policies(user_id).select_related("engine").order_by("-is_default", "slug")
    )
    default = next((p for p in policies if p.is_default), None)
    started = int(time.time())
    listed = [
        model_object(
            name,
            created=int(default.updated_at.timestamp()) if default else started,
            description=f"the default policy ({default.slug if default else 'built in'})",
        )
    ]
    listed += [
        model_object(
            f"{name}:{p.slug}",
            created=int(p.updated_at.timestamp()),
            description=f"{p.name}: {p.effective_mode}"
            + (f", answered by {p.engine.name}" if p.engine is not None else ""),
        )
        for p in policies
    ]
    return listed


@csrf_exempt
async def models(request):
    """Every output policy as a model."""
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        key = await _authenticate(request)
    except OpenAIError as exc:
        return _error_response(exc)
    return JsonResponse(model_list(await sync_to_async(_models)(key.user_id)).wire())


class _Reply:
    """One turn's events as an OpenAI client sees them: text deltas, then the end."""

    def __init__(self, chat: ChatRequest, completion_id: str):
        self.chat = chat
        self.id = completion_id
        self.created = int(time.time())
        self.shown = ""
        self.done: dict | None = None  # the `done` event's wire fields
        self.error: OpenAIError | None = None
        self._content_template: tuple[str, str] | None = None

    def take(self, event: events.Event) -> str:
        """Note one event; the text it adds to the answer now ("" for none)."""
        if isinstance(event, events.Chunk):
            self.shown += event.text
            return event.text
        if isinstance(event, events.Done):
            self.done = events.event_fields(event)
        elif isinstance(event, events.Error):
            if event.code == "storage_failed":  # the answer still reaches the client
                log.warning("API answer %s not stored: %s", self.id, event.message)
            else:
                self.error = turn_error(event.code, event.message)
        return ""

    def failure(self) -> OpenAIError:
        return self.error or turn_error("model_error", "the answer ended without a result")

    def chunk(self, **fields) -> str:
        body = chunk(completion_id=self.id, created=self.created, model=self.chat.model, **fields)
        return _sse(body.wire())

    def content_chunk(self, text: str) -> str:
        """`chunk(delta=Delta(content=text))`, from a template built once per answer: the
        one event sent per token, so its model and dict are not rebuilt each time."""
        if self._content_template is None:
            head, mark, tail = self.chunk(delta=Delta(content=_MARK)).partition(json.dumps(_MARK))
            assert mark, "the chunk's wire form carries its delta's text as a JSON string"
            self._content_template = (head, tail)
        head, tail = self._content_template
        return head + json.dumps(text, ensure_ascii=False) + tail

    def ending(self) -> list[str]:
        """The last server-sent events of a stream, after every delta."""
        if self.done is None:
            return [_sse(self.failure().body())]
        answer = answer_of(self.done, shown=self.shown, tools=self.chat.tools)
        rest = Delta(content=answer.delta or None, refusal=answer.refusal or None)
        events = [self.chunk(delta=rest)] if answer.delta or answer.refusal else []
        events += [self.chunk(delta=d) for d in tool_call_deltas(answer.tool_calls or [])]
        events.append(
            self.chunk(
                delta=Delta(),
                finish_reason=answer.finish_reason,
                native_finish_reason=answer.native_finish_reason,
            )
        )
        if self.chat.include_usage:
            events.append(self.chunk(usage=usage_of(self.done)))
        return events

    def completion(self) -> dict:
        assert self.done is not None  # the view answers a failure before asking
        answer = answer_of(self.done, shown=self.shown, tools=self.chat.tools)
        return completion(
            completion_id=self.id,
            created=self.created,
            model=self.chat.model,
            answer=answer,
            usage=usage_of(self.done),
            done=self.done,
        ).wire()


# Stands for a delta's text in the template of a content chunk (never in a model's text).
_MARK = "\u0000chat-content\u0000"


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _body(request) -> bytes:
    """The request body through the input edge: 413 in OpenAI's shape past MAX_BODY_BYTES."""
    try:
        return inputs.body_read(request, limit=MAX_BODY_BYTES)
    except inputs.InputError as exc:
        raise input_error(exc) from None


async def _start(request, feed: TurnFeed) -> tuple[ChatRequest, str]:
    """Authenticate, check and start the turn; OpenAIError if it was refused."""
    body = _body(request)  # an oversized body is a 413 before anything else is read
    key = await _authenticate(request)
    chat = parse_chat_request(
        body,
        model_name=settings.CHAT_API_MODEL_NAME,
        max_prompt_chars=settings.CHAT_MAX_PROMPT_CHARS,
    )
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    prompt = Prompt(request_id=completion_id, text=chat.text, conversation=None, policy=chat.policy)
    try:
        turn = await turns.admit(
            owner=owner_of_api_key(key),
            prompt=prompt,
            send=feed.send,
            given=turns.Given(
                history=chat.history,
                override=chat.override,
                sampling=chat.sampling,
                api_key_id=key.pk,
            ),
        )
    except turns.TurnError as exc:
        raise turn_error(exc.code, exc.message, exc.resets_at) from None
    feed.follow(turn)
    return chat, completion_id


@csrf_exempt
async def chat_completions(request):
    """One chat turn in OpenAI's shape, streamed or whole."""
    if request.method != "POST":
        return _method_not_allowed("POST")
    feed = TurnFeed()
    try:
        chat, completion_id = await _start(request, feed)
    except OpenAIError as exc:
        return _error_response(exc)
    reply = _Reply(chat, completion_id)
    if not chat.stream:
        try:
            for event in await feed.all_events():
                reply.take(event)
        finally:
            feed.abandon()  # Django cancels this view when the client goes away
        if reply.done is None:
            return _error_response(reply.failure())
        return JsonResponse(reply.completion())

    async def stream():
        # Bytes, not str: Django would look the charset up in the settings for every chunk.
        try:
            yield reply.chunk(delta=Delta(role="assistant", content="")).encode()
            async for batch in feed.batches_until_end():
                # What arrived together goes out in one write: one delta for its text.
                text = "".join([reply.take(e) for e in batch if e is not KEEPALIVE])
                if text:
                    yield reply.content_chunk(text).encode()
                elif batch[-1] is KEEPALIVE:
                    yield KEEPALIVE.encode()
            yield ("".join(reply.ending()) + "data: [DONE]\n\n").encode()
        finally:
            feed.abandon()  # the client closed the stream: stop the model

    return sse_response(request, stream())


@csrf_exempt
async def not_found(request, rest: str = ""):  # noqa: ARG001 (Django's signature)
    """Any other /v1/ path: OpenAI's 404, not an HTML page."""
    return _error_response(
        OpenAIError(
            404,
            f"no endpoint {request.path}; this server offers /v1/models and /v1/chat/completions",
            code="unknown_url",
        )
    )
