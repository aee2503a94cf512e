"""The one place a chat turn is orchestrated: conversation -> prompt -> queue -> engine -> persist.

The consumer (and any other transport) calls `turn_start` and forwards the events
it is handed; it never touches the model or the database itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction

from .engine.types import EngineError, Failed, Finished, GenerationRequest, Queued, Started, TextChunk
from .models import Conversation, Message
from .runtime import NotReady, runtime

log = logging.getLogger(__name__)

Send = Callable[[dict], Awaitable[None]]


class TurnError(Exception):
    """A turn refused before it started; `code` and `message` go to the client as `error`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Owner:
    """Who a conversation belongs to: a signed-in user, else a visitor's session."""

    user_id: int | None
    session_key: str


def conversations_for(owner: Owner):
    """The conversations `owner` may read or continue; nobody else's, ever."""
    if owner.user_id is not None:
        return Conversation.objects.filter(user_id=owner.user_id)
    return Conversation.objects.filter(user__isnull=True, session_key=owner.session_key)


# -- preparing a turn (sync, in a worker thread) -----------------------------------

@dataclass
class _Prepared:
    conversation: Conversation
    assistant: Message
    request: GenerationRequest


def _history(conversation: Conversation | None) -> list[dict]:
    if conversation is None:
        return []
    rows = (
        conversation.messages.filter(status=Message.Status.DONE)
        .exclude(text="")
        .order_by("-created_at", "-id")[: settings.CHAT_HISTORY_TURNS]
    )
    return [{"role": m.role, "content": m.text} for m in reversed(rows)]


def _fit_prompt(backend, history: list[dict], text: str, max_new_tokens: int) -> list[int]:
    """Tokenized model input; drops the oldest turns when the context is full, never the new prompt."""
    system = [{"role": "system", "content": settings.CHAT_SYSTEM_PROMPT}] if settings.CHAT_SYSTEM_PROMPT else []
    while True:
        messages = system + history + [{"role": "user", "content": text}]
        input_ids = backend.encode(backend.render(messages))
        if len(input_ids) + max_new_tokens <= backend.context_length or not history:
            backend.check_fits(len(input_ids), max_new_tokens)
            return input_ids
        history = history[2:]


def _prepare(owner: Owner, prompt, backend) -> _Prepared:
    conversation = None
    if prompt.conversation is not None:
        conversation = conversations_for(owner).filter(pk=prompt.conversation).first()
        if conversation is None:
            raise TurnError("unknown_conversation", f"conversation {prompt.conversation} does not exist")
    max_new_tokens = min(settings.CHAT_MAX_NEW_TOKENS, settings.CHAT_MAX_NEW_TOKENS_CAP)
    try:
        input_ids = _fit_prompt(backend, _history(conversation), prompt.text, max_new_tokens)
    except EngineError as exc:
        raise TurnError(exc.code, str(exc)) from None
    with transaction.atomic():
        if conversation is None:
            conversation = Conversation.objects.create(
                user_id=owner.user_id,
                session_key="" if owner.user_id is not None else owner.session_key,
                title=" ".join(prompt.text.split())[:80],
            )
        Message.objects.create(conversation=conversation, role=Message.Role.USER, text=prompt.text)
        assistant = Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            request_id=prompt.request_id,
        )
    request = GenerationRequest(input_ids=input_ids, max_new_tokens=max_new_tokens, label=prompt.request_id)
    return _Prepared(conversation, assistant, request)


def _store_answer(message_id: int, *, text: str, status: str, finish_reason: str, metrics: dict, error: str = "") -> None:
    with transaction.atomic():
        Message.objects.filter(pk=message_id).update(
            text=text, status=status, finish_reason=finish_reason, metrics=metrics, error=error
        )
        conversation_id = Message.objects.values_list("conversation_id", flat=True).get(pk=message_id)
        Conversation.objects.get(pk=conversation_id).save(update_fields=["updated_at"])


# -- running a turn (async) --------------------------------------------------------

@dataclass(eq=False)
class Turn:
    """A running chat turn; the transport may `cancel` it or `detach` from it (tab closed)."""

    request_id: str
    conversation_id: int
    message_id: int
    send: Send | None
    accepted_at: float
    _scheduler: object = None
    _ticket: object = None
    _events: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    finished: bool = False

    def cancel(self) -> None:
        self._scheduler.cancel(self._ticket)

    def detach(self) -> None:
        """Stop sending to the client; the answer is still stored when it ends."""
        self.send = None

    async def _emit(self, event: dict) -> None:
        if self.send is None:
            return
        try:
            await self.send(event)
        except Exception:  # the socket went away mid-send: keep generating state consistent
            log.info("client of %s went away; cancelling", self.request_id)
            self.send = None
            self.cancel()


async def turn_start(*, owner: Owner, prompt, send: Send) -> Turn:
    """Validate and queue one prompt; sends `accepted` and returns the running turn."""
    try:
        backend, scheduler = runtime.require()
    except NotReady as exc:
        raise TurnError(exc.code, str(exc)) from None
    accepted_at = time.perf_counter()
    prepared = await sync_to_async(_prepare, thread_sensitive=True)(owner, prompt, backend)
    loop = asyncio.get_running_loop()
    turn = Turn(
        request_id=prompt.request_id,
        conversation_id=prepared.conversation.pk,
        message_id=prepared.assistant.pk,
        send=send,
        accepted_at=accepted_at,
        _scheduler=scheduler,
    )

    def sink(event) -> None:  # called on the generation thread; must not block
        loop.call_soon_threadsafe(turn._events.put_nowait, event)

    try:
        turn._ticket, position = scheduler.submit(prepared.request, sink)
    except EngineError as exc:
        await sync_to_async(_store_answer)(
            turn.message_id, text="", status=Message.Status.FAILED, finish_reason="", metrics={}, error=str(exc)
        )
        raise TurnError(exc.code, str(exc)) from None
    await turn._emit(
        {
            "type": "accepted",
            "request_id": turn.request_id,
            "conversation": turn.conversation_id,
            "message": turn.message_id,
            "queue_position": position,
        }
    )
    turn.task = asyncio.create_task(_pump(turn), name=f"turn-{turn.request_id}")
    return turn


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def _pump(turn: Turn) -> None:
    """Forward engine events to the client until the answer ends, then store it."""
    started_at = first_chunk_at = None
    parts: list[str] = []  # what the client has seen, kept if the model fails midway
    try:
        while True:
            event = await turn._events.get()
            if isinstance(event, TextChunk):
                if first_chunk_at is None:
                    first_chunk_at = time.perf_counter()
                parts.append(event.text)
                await turn._emit({"type": "chunk", "request_id": turn.request_id, "text": event.text})
            elif isinstance(event, Queued):
                await turn._emit({"type": "queued", "request_id": turn.request_id, "queue_position": event.position})
            elif isinstance(event, Started):
                started_at = event.at
            elif isinstance(event, Finished):
                await _finish(turn, event.result, started_at, first_chunk_at)
                return
            elif isinstance(event, Failed):
                await _fail(turn, event, started_at, "".join(parts))
                return
    finally:
        turn.finished = True


async def _finish(turn: Turn, result, started_at, first_chunk_at) -> None:
    done_at = time.perf_counter()
    metrics = {
        "queue_ms": _ms((started_at or result.started_at) - turn.accepted_at),
        "ttft_ms": _ms((first_chunk_at or done_at) - turn.accepted_at),
        "total_ms": _ms(done_at - turn.accepted_at),
        "new_tokens": result.new_tokens,
        "tokens_per_s": round(result.tokens_per_s, 2),
        "prompt_tokens": result.prompt_tokens,
        "model_ttft_ms": _ms(result.first_token_at - result.started_at) if result.first_token_at else None,
    }
    status = Message.Status.CANCELLED if result.finish_reason == "cancelled" else Message.Status.DONE
    try:
        await sync_to_async(_store_answer)(
            turn.message_id, text=result.text, status=status, finish_reason=result.finish_reason, metrics=metrics
        )
    except Exception:
        log.exception("could not store the answer of %s", turn.request_id)
        await turn._emit(
            {"type": "error", "request_id": turn.request_id, "code": "storage_failed",
             "message": "the answer was generated but could not be saved; it will not appear in your history"}
        )
    await turn._emit(
        {
            "type": "done",
            "request_id": turn.request_id,
            "message": turn.message_id,
            "text": result.text,
            "json": None,
            "finish_reason": result.finish_reason,
            "cached": False,
            "metrics": metrics,
        }
    )


async def _fail(turn: Turn, event: Failed, started_at, partial_text: str) -> None:
    metrics = {"queue_ms": _ms((started_at or event.at) - turn.accepted_at), "total_ms": _ms(event.at - turn.accepted_at)}
    try:
        await sync_to_async(_store_answer)(
            turn.message_id, text=partial_text, status=Message.Status.FAILED, finish_reason="", metrics=metrics,
            error=event.error,
        )
    except Exception:
        log.exception("could not store the failure of %s", turn.request_id)
    await turn._emit(
        {"type": "error", "request_id": turn.request_id, "code": "model_error",
         "message": "the model failed while answering; please try again"}
    )
