"""The one place a chat turn is orchestrated: policy -> prompt -> queue -> engine -> gate -> persist.

The consumer (and any other transport) calls `turn_start` and forwards the events
it is handed; it never touches the model or the database itself.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, transaction

from . import metrics as prometheus
from . import policies, review, storage
from .cache import CACHEABLE_FINISH, cache_key, completion_cache
from .cancel_bus import CancelBus
from .engine.types import (
    EngineError,
    Failed,
    Finished,
    GenerationRequest,
    Queued,
    Started,
    TextChunk,
)
from .models import Conversation, Message
from .policy import Emit, Hold, Retract, gate_for, reask_message
from .ratelimit import prompt_limiter
from .runtime import NotReady, runtime

log = logging.getLogger(__name__)

Send = Callable[[dict], Awaitable[None]]

# Answers the model should not see again as context: withdrawn or invalid ones.
_NOT_CONTEXT = ("moderated", "invalid")
# Sampling temperature of a regenerated answer when its policy is greedy.
REGENERATE_TEMPERATURE = 0.8


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

    @property
    def rate_key(self) -> str:
        return f"user:{self.user_id}" if self.user_id is not None else f"session:{self.session_key}"

    def is_same(self, other: Owner) -> bool:
        """The same signed-in user (from any session), or the same visitor's session."""
        return self.rate_key == other.rate_key


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
    policy: policies.ResolvedPolicy
    messages: list[dict]  # the chat as rendered for the model, for re-asks
    rendered: str
    request: GenerationRequest
    cache_key: str | None


def _history(conversation: Conversation | None) -> list[dict]:
    if conversation is None:
        return []
    rows = (
        conversation.messages.filter(status=Message.Status.DONE, superseded=False)
        .exclude(text="")
        .exclude(finish_reason__in=_NOT_CONTEXT)
        .order_by("-created_at", "-id")[: settings.CHAT_HISTORY_TURNS]
    )
    return [{"role": m.role, "content": m.text} for m in reversed(rows)]


def _fit_prompt(backend, policy: policies.ResolvedPolicy, history: list[dict], text: str):
    """(messages, rendered prompt, input ids); drops the oldest turns when the context is full, never the new prompt."""
    max_new_tokens = policy.max_new_tokens
    head = [{"role": "system", "content": policy.system_prompt}] if policy.system_prompt else []
    for user, assistant in policy.examples:
        head += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    while True:
        messages = head + history + [{"role": "user", "content": text}]
        rendered = backend.render(messages)
        input_ids = backend.encode(rendered)
        if len(input_ids) + max_new_tokens <= backend.context_length or not history:
            backend.check_fits(len(input_ids), max_new_tokens)
            return messages, rendered, input_ids
        history = history[2:]


def _request_for(
    backend, policy: policies.ResolvedPolicy, input_ids: list[int], label: str, messages: list[dict]
) -> GenerationRequest:
    eos_ids = tuple(
        i for i in (backend.token_id(t) for t in policy.extra_eos_tokens) if i is not None
    )
    return GenerationRequest(
        input_ids=input_ids,
        max_new_tokens=policy.max_new_tokens,
        stop_strings=policy.stop_strings,
        eos_token_ids=eos_ids,
        temperature=policy.temperature,
        top_p=policy.top_p,
        json_schema=policy.schema if policy.constrained else None,
        label=label,
        messages=messages,
    )


def _check_prompt_tokens(backend, text: str) -> None:
    """A per-prompt limit in the model's tokens; characters alone let odd text cost many tokens each."""
    limit = settings.CHAT_MAX_PROMPT_TOKENS
    if limit <= 0:
        return
    tokens = backend.token_count(text)
    if tokens > limit:
        raise TurnError(
            "prompt_too_long",
            f"the prompt is {len(text)} characters and {tokens} tokens; the limits are "
            f"{settings.CHAT_MAX_PROMPT_CHARS} characters and {limit} tokens",
        )


def _prepare(owner: Owner, prompt, backend) -> _Prepared:
    _check_prompt_tokens(backend, prompt.text)
    try:
        policy = policies.policy_for(prompt.policy)
    except policies.UnknownPolicy as exc:
        raise TurnError(exc.code, str(exc)) from None
    conversation = None
    if prompt.conversation is not None:
        conversation = conversations_for(owner).filter(pk=prompt.conversation).first()
        if conversation is None:
            raise TurnError(
                "unknown_conversation", f"conversation {prompt.conversation} does not exist"
            )
    with transaction.atomic():  # a replaced answer stays current if the new prompt is refused
        regenerate = prompt.replace is not None and _supersede(conversation, prompt) == prompt.text
        try:
            messages, rendered, input_ids = _fit_prompt(
                backend, policy, _history(conversation), prompt.text
            )
        except EngineError as exc:
            raise TurnError(exc.code, str(exc)) from None
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
            instance=settings.CHAT_INSTANCE,
            policy_id=policy.id,
            policy_version=policy.version if policy.id else None,
        )
    request = _request_for(backend, policy, input_ids, prompt.request_id, messages)
    key = _cache_key(backend, policy, rendered, request) if policy.cache_enabled else None
    if regenerate:
        # A new answer, not the same greedy one again: sample, and neither serve nor store a cached one.
        temperature = max(request.temperature, REGENERATE_TEMPERATURE)
        request, key = replace(request, temperature=temperature), None
    return _Prepared(conversation, assistant, policy, messages, rendered, request, key)


def _supersede(conversation: Conversation, prompt) -> str:
    """Mark the last prompt and its answer `prompt.replace` as earlier versions; their prompt text."""
    answer = (
        conversation.messages.filter(role=Message.Role.ASSISTANT, superseded=False)
        .select_for_update()
        .last()
    )
    if answer is None or answer.pk != prompt.replace or answer.status == Message.Status.STREAMING:
        raise TurnError(
            "bad_message",
            "replace must name the conversation's last answer, once it has finished",
        )
    asked = conversation.messages.filter(
        role=Message.Role.USER, superseded=False, id__lt=answer.pk
    ).last()
    conversation.messages.filter(pk__in=[answer.pk, asked.pk if asked else answer.pk]).update(
        superseded=True
    )
    return asked.text if asked else ""


def _cache_key(
    backend, policy: policies.ResolvedPolicy, rendered: str, request: GenerationRequest
) -> str:
    params = {
        "max_new_tokens": min(request.max_new_tokens, backend.config.max_new_tokens_cap),
        "stop_strings": list(request.stop_strings),
        "eos_token_ids": sorted({*backend.eos_token_ids, *request.eos_token_ids}),
        "temperature": request.temperature,
        "top_p": request.top_p,
        "json_schema": request.json_schema,
    }
    return cache_key(
        model_id=backend.model_id,
        fingerprint=backend.fingerprint,
        rendered_prompt=rendered,
        params=params,
        policy_slug=policy.slug,
        policy_version=policy.version,
    )


# -- running a turn (async) --------------------------------------------------------


@dataclass(eq=False)
class Turn:
    """A running chat turn; the transport may `cancel` it or `detach` from it (tab closed)."""

    request_id: str
    conversation_id: int
    message_id: int
    send: Send | None
    accepted_at: float
    policy: policies.ResolvedPolicy
    messages: list[dict]
    owner: Owner | None = None
    prompt_text: str = ""
    rendered: str = ""
    cache_key: str | None = None
    _backend: object = None
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

    def _submit(self, request: GenerationRequest, *, expected: bool = False) -> int:
        loop = asyncio.get_running_loop()

        def sink(event) -> None:  # called on the generation thread; must not block
            loop.call_soon_threadsafe(self._events.put_nowait, event)

        self._ticket, position = self._scheduler.submit(request, sink, expected=expected)
        return position

    async def _emit(self, event: dict) -> None:
        if self.send is None:
            return
        try:
            await self.send(event)
        except Exception:  # the socket went away mid-send: nobody is reading any more
            log.info("client of %s went away; cancelling", self.request_id)
            self.send = None
            self.cancel()


def turn_rate_check(*, owner: Owner) -> None:
    """Count one prompt against the owner's per-minute limit; TurnError `rate_limited` when over it."""
    wait = prompt_limiter.check(owner.rate_key)
    if wait:
        raise TurnError(
            "rate_limited",
            f"too many prompts: at most {prompt_limiter.limit} a minute; try again in {wait:.0f} s",
        )


async def turn_start(*, owner: Owner, prompt, send: Send) -> Turn:
    """Validate and queue one prompt; sends `accepted` and returns the running turn."""
    try:
        backend, scheduler = runtime.require()
    except NotReady as exc:
        raise TurnError(exc.code, str(exc)) from None
    accepted_at = time.perf_counter()
    scheduler.expect()  # users arriving together are batched together
    submitted = False
    try:
        try:
            prepared = await sync_to_async(storage.closing_on_error)(
                _prepare, owner, prompt, backend
            )
        except DatabaseError as exc:
            log.warning("could not start %s: %s", prompt.request_id, exc)
            raise TurnError(
                "storage_failed",
                "the database is unavailable, so the prompt was not started; try again in a moment",
            ) from None
        turn = Turn(
            request_id=prompt.request_id,
            conversation_id=prepared.conversation.pk,
            message_id=prepared.assistant.pk,
            send=send,
            accepted_at=accepted_at,
            policy=prepared.policy,
            messages=prepared.messages,
            owner=owner,
            prompt_text=prompt.text,
            rendered=prepared.rendered,
            cache_key=prepared.cache_key,
            _backend=backend,
            _scheduler=scheduler,
        )
        if turn.cache_key is not None:
            entry = await sync_to_async(completion_cache.get, thread_sensitive=False)(
                turn.cache_key
            )
            if entry is not None:
                await _serve_cached(turn, entry)
                return turn
            prometheus.CACHE_MISSES.inc()
        try:
            position = turn._submit(prepared.request, expected=True)
            submitted = True
        except EngineError as exc:
            await sync_to_async(storage.store_answer)(
                turn.message_id, status=Message.Status.FAILED, error=str(exc)
            )
            raise TurnError(exc.code, str(exc)) from None
    finally:
        if not submitted:
            scheduler.unexpect()
    _running[turn.message_id] = turn
    cancel_bus.ensure_listening()
    await turn._emit(
        {
            "type": "accepted",
            "request_id": turn.request_id,
            "conversation": turn.conversation_id,
            "message": turn.message_id,
            "queue_position": position,
        }
    )
    # A fresh context: the turn outlives the request that started it (an HTTP view's
    # thread-sensitive executor is gone once the view returns).
    turn.task = asyncio.create_task(
        _TurnRun(turn, prepared.request).run(),
        name=f"turn-{turn.request_id}",
        context=contextvars.Context(),
    )
    return turn


# -- cancelling a turn from any connection or process -------------------------------

# The turns generating in this process, by message id: where a cancel from elsewhere looks.
_running: dict[int, Turn] = {}


def _cancel_heard(message_id: int, user_id: int | None, session_key: str) -> None:
    """A cancel published by another process: stop the turn if it runs here and is the same owner's."""
    turn = _running.get(message_id)
    if (
        turn is not None
        and not turn.finished
        and turn.owner.is_same(Owner(user_id=user_id, session_key=session_key))
    ):
        log.info("cancel for message %s from another process", message_id)
        turn.cancel()


cancel_bus = CancelBus(_cancel_heard)


def _answer_status(owner: Owner, message_id: int) -> str | None:
    return (
        Message.objects.filter(
            pk=message_id, role=Message.Role.ASSISTANT, conversation__in=conversations_for(owner)
        )
        .values_list("status", flat=True)
        .first()
    )


async def turn_cancel(*, owner: Owner, message_id: int) -> str:
    """Stop the owner's answer `message_id` wherever it runs.

    Returns "cancelled" (it ran here and was stopped), "sent" (it runs in another
    process, which was told), or "finished" (it had already ended: nothing to do).
    Raises TurnError `unknown_request` for an answer that is not the owner's or does
    not exist, and `cancel_unavailable` when another process cannot be reached.
    """
    status = await sync_to_async(_answer_status)(owner, message_id)
    if status is None:
        raise TurnError("unknown_request", f"you have no answer {message_id}")
    if status != Message.Status.STREAMING:
        return "finished"
    turn = _running.get(message_id)
    if turn is not None:
        if turn.finished:
            return "finished"
        turn.cancel()
        return "cancelled"
    try:
        await cancel_bus.publish(
            message_id=message_id, user_id=owner.user_id, session_key=owner.session_key
        )
    except Exception as exc:
        log.warning(
            "could not publish the cancel of message %s: %s: %s",
            message_id,
            type(exc).__name__,
            exc,
        )
        raise TurnError(
            "cancel_unavailable",
            "the answer runs on another server, which cannot be reached right now; try again",
        ) from None
    return "sent"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def _serve_cached(turn: Turn, entry: dict) -> None:
    """A hit: one `done` with cached=true, no queue, no generation; the message is stored as usual."""
    await turn._emit(
        {
            "type": "accepted",
            "request_id": turn.request_id,
            "conversation": turn.conversation_id,
            "message": turn.message_id,
            "queue_position": 0,
        }
    )
    elapsed = _ms(time.perf_counter() - turn.accepted_at)
    metrics = {
        "queue_ms": 0.0,
        "ttft_ms": elapsed,
        "ttfv_ms": elapsed,
        "total_ms": elapsed,
        "held_ms": None,
        "new_tokens": 0,
        "tokens_per_s": 0.0,
        "cached_new_tokens": entry.get("new_tokens"),
        "retries": 0,
    }
    done = {
        "type": "done",
        "request_id": turn.request_id,
        "message": turn.message_id,
        "text": entry["text"],
        "json": entry.get("json"),
        "finish_reason": entry["finish_reason"],
        "cached": True,
        "metrics": metrics,
        "reason": None,
        "policy": turn.policy.slug,
    }
    await turn._emit(done)
    turn.finished = True
    prometheus.observe_done(metrics, entry["finish_reason"], cached=True)
    try:
        await sync_to_async(storage.closing_on_error)(
            storage.store_cached_answer,
            turn.message_id,
            entry.get("record"),
            text=entry["text"],
            status=Message.Status.DONE,
            finish_reason=entry["finish_reason"],
            metrics=metrics,
            outcome="ok",
            json_value=entry.get("json"),
            raw_text=entry["text"],
        )
    except Exception:
        log.exception("could not store the cached answer of %s", turn.request_id)
        await turn._emit(
            {
                "type": "error",
                "request_id": turn.request_id,
                "code": "storage_failed",
                "message": "the answer could not be saved; it will not appear in your history",
            }
        )


class _TurnRun:
    """Drives one turn to its end: forwards chunks through the policy gate, re-asks, stores."""

    def __init__(self, turn: Turn, request: GenerationRequest):
        self.turn = turn
        self.request = request
        self.started_at: float | None = None
        self.first_token_at: float | None = None
        self.first_visible_at: float | None = None
        self.held_at: float | None = None
        self.retracted: str | None = None
        self.retries = 0
        self.new_tokens = 0

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.turn.finished = True
            _running.pop(self.turn.message_id, None)

    async def _run(self) -> None:
        policy = self.turn.policy
        while True:
            gate = gate_for(policy.mode, hooks=policy.hooks, schema=policy.schema)
            outcome_event = await self._generate(gate)
            if isinstance(outcome_event, Failed):
                return await self._fail(outcome_event, gate.shown)
            result = outcome_event.result
            self.new_tokens += result.new_tokens
            if self.retracted is not None:
                return await self._finish(
                    result,
                    "moderated",
                    text="",
                    raw=gate.text,
                    outcome="moderated",
                    reason=self.retracted,
                )
            if result.finish_reason == "cancelled":
                return await self._finish(result, "cancelled", text=gate.shown, raw=gate.text)
            actions, outcome = gate.finish()
            await self._apply(actions)
            if outcome.status == "ok":
                # What was shown plus what was held back: the whole text in every mode.
                return await self._finish(
                    result,
                    result.finish_reason,
                    text=gate.shown + outcome.held_text,
                    raw=gate.text,
                    outcome="ok",
                    json_value=outcome.json,
                )
            if outcome.status == "moderated":
                return await self._finish(
                    result,
                    "moderated",
                    text="",
                    raw=gate.text,
                    outcome="moderated",
                    reason=outcome.reason,
                )
            prometheus.VALIDATION_FAILURES.inc()
            # invalid: nothing was shown in buffer mode, so the model may try again
            if (
                policy.mode == "buffer"
                and self.retries < policy.max_retries
                and self._reask(gate.text, outcome.reason)
            ):
                self.retries += 1
                continue
            text = policy.fallback_text if policy.failure_action == "fallback" else gate.shown
            return await self._finish(
                result,
                "invalid",
                text=text,
                raw=gate.text,
                outcome="invalid",
                reason=outcome.reason,
            )

    async def _generate(self, gate):
        """Pump one generation's events through the gate; returns its Finished or Failed."""
        turn = self.turn
        while True:
            event = await turn._events.get()
            if isinstance(event, TextChunk):
                if self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                await self._apply(gate.feed(event.text))
            elif isinstance(event, Queued):
                await turn._emit(
                    {
                        "type": "queued",
                        "request_id": turn.request_id,
                        "queue_position": event.position,
                    }
                )
            elif isinstance(event, Started):
                self.started_at = self.started_at or event.at
            elif isinstance(event, (Finished, Failed)):
                return event

    async def _apply(self, actions) -> None:
        turn = self.turn
        for action in actions:
            if isinstance(action, Emit):
                self.first_visible_at = self.first_visible_at or time.perf_counter()
                await turn._emit(
                    {"type": "chunk", "request_id": turn.request_id, "text": action.text}
                )
            elif isinstance(action, Hold):
                self.held_at = self.held_at or time.perf_counter()
                await turn._emit(
                    {"type": "buffering", "request_id": turn.request_id, "reason": action.reason}
                )
            elif isinstance(action, Retract):
                self.retracted = action.reason
                turn._scheduler.cancel(
                    turn._ticket
                )  # not the user's cancel: the answer is withdrawn
                await turn._emit(
                    {"type": "retract", "request_id": turn.request_id, "reason": action.reason}
                )

    def _reask(self, bad_answer: str, reason: str) -> bool:
        """Queue another attempt with the validation error; False if it cannot fit."""
        turn = self.turn
        messages = turn.messages + [
            {"role": "assistant", "content": bad_answer},
            {"role": "user", "content": reask_message(reason, turn.policy.schema)},
        ]
        backend = turn._backend
        input_ids = backend.encode(backend.render(messages))
        if len(input_ids) + self.request.max_new_tokens > backend.context_length:
            return False
        self.request = replace(
            self.request, input_ids=input_ids, messages=messages
        )  # same cancel flag
        try:
            turn._submit(self.request)
        except EngineError:
            return False
        return True

    def _metrics(self, done_at: float, result) -> dict:
        turn = self.turn
        decode = (result.finished_at - result.started_at) if result else None
        return {
            "queue_ms": _ms((self.started_at or done_at) - turn.accepted_at),
            "ttft_ms": _ms((self.first_token_at or done_at) - turn.accepted_at),
            "ttfv_ms": _ms((self.first_visible_at or done_at) - turn.accepted_at),
            "total_ms": _ms(done_at - turn.accepted_at),
            "held_ms": _ms(done_at - self.held_at) if self.held_at else None,
            "new_tokens": self.new_tokens,
            "tokens_per_s": round(result.new_tokens / decode, 2)
            if result and result.new_tokens and decode
            else 0.0,
            "prompt_tokens": result.prompt_tokens if result else None,
            "retries": self.retries,
        }

    async def _finish(
        self,
        result,
        finish_reason: str,
        *,
        text: str,
        raw: str,
        outcome: str = "",
        reason: str = "",
        json_value=None,
    ) -> None:
        turn = self.turn
        done_at = time.perf_counter()
        metrics = self._metrics(done_at, result)
        status = Message.Status.CANCELLED if finish_reason == "cancelled" else Message.Status.DONE
        try:
            stored = await storage.answer_store(
                message_id=turn.message_id,
                request_id=turn.request_id,
                text=text,
                status=status,
                finish_reason=finish_reason,
                metrics=metrics,
                raw_text=raw,
                outcome=outcome,
                outcome_reason=reason,
                json_value=json_value,
                retries=self.retries,
                held_ms=metrics["held_ms"],
            )
            problem = (
                "the database is unavailable; the server keeps trying for a few minutes, until then it is "
                "missing from your history"
            )
        except Exception:
            log.exception("could not store the answer of %s", turn.request_id)
            stored, problem = False, "it will not appear in your history"
        if not stored:
            await turn._emit(
                {
                    "type": "error",
                    "request_id": turn.request_id,
                    "code": "storage_failed",
                    "message": f"the answer was generated but could not be saved: {problem}",
                }
            )
        if finish_reason == "moderated" and self.retracted is None:
            # Vetoed only at the end: anything shown must still be withdrawn.
            await turn._emit({"type": "retract", "request_id": turn.request_id, "reason": reason})
        await turn._emit(
            {
                "type": "done",
                "request_id": turn.request_id,
                "message": turn.message_id,
                "text": text,
                "json": json_value,
                "finish_reason": finish_reason,
                "cached": False,
                "metrics": metrics,
                "reason": reason or None,
                "policy": turn.policy.slug,
            }
        )
        prometheus.observe_done(metrics, finish_reason, cached=False)
        if outcome == "ok" and finish_reason in CACHEABLE_FINISH and turn.cache_key is not None:
            await self._remember(text, json_value, finish_reason, metrics)

    async def _remember(self, text: str, json_value, finish_reason: str, metrics: dict) -> None:
        """Written after `done` went out, so caching never delays the answer."""
        turn = self.turn
        try:
            await sync_to_async(review.answer_remember)(
                key=turn.cache_key,
                prompt=turn.prompt_text,
                rendered_prompt=turn.rendered,
                text=text,
                json_value=json_value,
                finish_reason=finish_reason,
                metrics=metrics,
                policy_id=turn.policy.id,
                policy_slug=turn.policy.slug,
                policy_version=turn.policy.version,
                model_id=turn._backend.model_id,
                require_review=turn.policy.require_review,
            )
        except Exception:
            log.exception("could not record the cached answer of %s", turn.request_id)

    async def _fail(self, event: Failed, partial_text: str) -> None:
        turn = self.turn
        metrics = self._metrics(event.at, None)
        try:
            await storage.answer_store(
                message_id=turn.message_id,
                request_id=turn.request_id,
                text=partial_text,
                status=Message.Status.FAILED,
                metrics=metrics,
                error=event.error,
            )
        except Exception:
            log.exception("could not store the failure of %s", turn.request_id)
        prometheus.FAILURES.inc()
        await turn._emit(
            {
                "type": "error",
                "request_id": turn.request_id,
                "code": "model_error",
                "message": "the model failed while answering; please try again",
            }
        )
