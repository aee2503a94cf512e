"""The one place a chat turn is orchestrated: policy -> prompt -> cache -> queue -> engine -> gate -> store.

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
from . import policy_store, review, storage
from .cache import CACHEABLE_FINISH, completion_cache
from .cancel_bus import CancelBus, RunningTurns
from .engine.coalescing import coalescer
from .engine.types import (
    Backend,
    EngineError,
    Failed,
    Finished,
    GenerationRequest,
    Queued,
    Scheduler,
    Started,
    TextChunk,
    Ticket,
)
from .evictions import entry_servable
from .models import Conversation, Message
from .policy import Cut, Emit, Hold, Retract, gate_for, reask_message
from .prompting import fit_prompt, request_for, turn_cache_key
from .protocol import (
    CUT,
    INVALID,
    MODERATED,
    SERVER_RESTARTING,
    accepted_event,
    buffering_event,
    chunk_event,
    cut_event,
    done_event,
    error_event,
    metrics,
    queued_event,
    retract_event,
    server_restarting_event,
)
from .ratelimit import address_limiter, prompt_limiter
from .runtime import NotReady, runtime
from .selectors import Owner, answer_history, answer_status, conversations_for

log = logging.getLogger(__name__)

Send = Callable[[dict], Awaitable[None]]

# Sampling temperature of a regenerated answer when its policy is greedy.
REGENERATE_TEMPERATURE = 0.8


class TurnError(Exception):
    """A turn refused before it started; `code` and `message` go to the client as `error`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# -- preparing a turn (sync, in a worker thread) -----------------------------------


@dataclass
class _Prepared:
    conversation: Conversation
    assistant: Message
    policy: policy_store.ResolvedPolicy
    messages: list[dict]  # the chat as rendered for the model, for re-asks
    rendered: str  # the prompt's model input, for the cache's review record
    request: GenerationRequest
    cache_key: str | None
    asked: str  # the user's prompt this answer is to
    # A continuation: the answer's text and tokens so far, which the new text is appended to.
    answer_so_far: str = ""
    tokens_so_far: int = 0


@dataclass(frozen=True)
class _Given:
    """What a transport may give instead of the stored defaults (the OpenAI-compatible API)."""

    history: list[dict] | None = None  # earlier turns, in place of the conversation's
    override: policy_store.PolicyOverride | None = None
    api_key_id: int | None = None


def _check_prompt_tokens(backend: Backend, text: str) -> None:
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


def _prepare(owner: Owner, prompt, backend: Backend, given: _Given) -> _Prepared:
    if prompt.continues is not None:
        return _prepare_continue(owner, prompt, backend)
    _check_prompt_tokens(backend, prompt.text)
    try:
        policy = policy_store.policy_for(prompt.policy)
    except policy_store.UnknownPolicy as exc:
        raise TurnError(exc.code, str(exc)) from None
    if given.override is not None:
        policy = given.override.apply(policy)
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
            messages, rendered, input_ids = fit_prompt(
                backend,
                policy,
                answer_history(conversation) if given.history is None else given.history,
                prompt.text,
            )
        except EngineError as exc:
            raise TurnError(exc.code, str(exc)) from None
        if conversation is None:
            conversation = Conversation.objects.create(
                user_id=owner.user_id,
                session_key="" if owner.user_id is not None else owner.session_key,
                title=" ".join(prompt.text.split())[:80],
                api_key_id=given.api_key_id,
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
    request = request_for(backend, policy, input_ids, prompt.request_id, messages)
    key = turn_cache_key(backend, policy, rendered, request) if policy.cache_enabled else None
    if regenerate:
        # A new answer, not the same greedy one again: sample, and neither serve nor store a cached one.
        temperature = max(request.temperature, REGENERATE_TEMPERATURE)
        request, key = replace(request, temperature=temperature), None
    return _Prepared(conversation, assistant, policy, messages, rendered, request, key, prompt.text)


def _prepare_continue(owner: Owner, prompt, backend: Backend) -> _Prepared:
    """The rest of an answer cut off at the token limit, written into the same message.

    When it ends well, the whole answer is cached under its prompt's own key, so a repeat of
    that prompt gets all of it.
    """
    with transaction.atomic():
        answer = (
            Message.objects.select_for_update(of=("self",))  # only the answer: policy may be NULL
            .select_related("conversation", "policy")
            .filter(
                pk=prompt.continues,
                role=Message.Role.ASSISTANT,
                conversation__in=conversations_for(owner),
            )
            .first()
        )
        if answer is None:
            raise TurnError("unknown_request", f"you have no answer {prompt.continues}")
        conversation = answer.conversation
        last = conversation.messages.filter(superseded=False).last()
        if (
            last.pk != answer.pk
            or answer.status != Message.Status.DONE
            or answer.finish_reason != "length"
        ):
            raise TurnError(
                "bad_message",
                "only the conversation's last answer can be continued, and only when it was "
                "cut off at the token limit",
            )
        asked = conversation.messages.filter(
            role=Message.Role.USER, superseded=False, pk__lt=answer.pk
        ).last()
        if asked is None:
            raise TurnError("bad_message", "that answer has no prompt to continue from")
        policy = (
            policy_store.resolve(answer.policy)
            if answer.policy is not None
            else policy_store.policy_for(None)
        )
        history = answer_history(conversation, before=asked.pk)
        try:
            messages, _rendered, input_ids = fit_prompt(
                backend, policy, history, asked.text, answer_so_far=answer.text
            )
        except EngineError as exc:
            raise TurnError(exc.code, str(exc)) from None
        answer.status = Message.Status.STREAMING
        answer.request_id = prompt.request_id
        answer.instance = settings.CHAT_INSTANCE
        answer.save(update_fields=["status", "request_id", "instance", "updated_at"])
    request = request_for(backend, policy, input_ids, prompt.request_id, messages)
    # The cache entry (and its review record) is the prompt's, as if answered whole at once.
    asked_messages, asked_rendered, asked_ids = fit_prompt(backend, policy, history, asked.text)
    key = None
    if policy.cache_enabled and answer.policy_version == policy.version:
        asked_request = request_for(backend, policy, asked_ids, prompt.request_id, asked_messages)
        key = turn_cache_key(backend, policy, asked_rendered, asked_request)
    return _Prepared(
        conversation=conversation,
        assistant=answer,
        policy=policy,
        messages=messages,
        rendered=asked_rendered,
        request=request,
        cache_key=key,
        asked=asked.text,
        answer_so_far=answer.text,
        tokens_so_far=(answer.metrics or {}).get("new_tokens") or 0,
    )


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


# -- the turn a transport holds ------------------------------------------------------


@dataclass(eq=False)
class Turn:
    """A chat turn as its transport sees it: it may `cancel` it or `detach` from it (tab closed)."""

    request_id: str
    conversation_id: int
    message_id: int
    owner: Owner
    send: Send | None
    task: asyncio.Task | None = None
    finished: bool = False
    _run: _TurnRun | None = field(default=None, repr=False)

    def cancel(self, reason: str = "") -> None:
        """Stop generating within one decode step; the partial answer is still stored.

        `reason` goes with the `done` (finish_reason "cancelled") when it is not the user's Stop.
        """
        if self._run is not None:
            self._run.stop(reason)

    @property
    def cancel_requested(self) -> bool:
        return self._run is not None and self._run.request.cancel.is_set()

    def detach(self) -> None:
        """Stop sending to the client; the answer is still stored when it ends."""
        self.send = None

    async def emit(self, event: dict) -> None:
        """Send one event to the client, if it is still listening."""
        if self.send is None:
            return
        try:
            await self.send(event)
        except Exception:  # the socket went away mid-send: nobody is reading any more
            log.info("client of %s went away; cancelling", self.request_id)
            self.send = None
            self.cancel()


def turn_rate_check(*, owner: Owner, address: str | None = None) -> None:
    """Count one prompt against the owner's per-minute limit, and a visitor's address's;
    TurnError `rate_limited` when over either (then neither is counted), and
    `server_restarting` while the process drains (then nothing is counted)."""
    if runtime.draining:
        raise TurnError(SERVER_RESTARTING, server_restarting_event()["message"])
    limits = [(prompt_limiter, owner.rate_key)]
    if owner.user_id is None and address is not None:
        limits.append((address_limiter, f"address:{address}"))
    for limiter, key in limits:
        wait = limiter.wait(key)
        if wait:
            raise TurnError(
                "rate_limited",
                f"too many prompts{' from this address' if limiter is address_limiter else ''}: "
                f"at most {limiter.limit} a minute; try again in {wait:.0f} s",
            )
    for limiter, key in limits:
        limiter.check(key)


async def turn_start(
    *,
    owner: Owner,
    prompt,
    send: Send,
    history: list[dict] | None = None,
    override: policy_store.PolicyOverride | None = None,
    api_key_id: int | None = None,
) -> Turn:
    """Validate and queue one prompt; sends `accepted` and returns the running turn.

    The socket and the page's HTTP API give only `prompt`. The OpenAI-compatible API gives
    the earlier turns itself (`history`, user/assistant messages, in place of the stored
    conversation's), its per-request `override` of the policy, and the `api_key_id` the
    new conversation is recorded under.
    """
    given = _Given(history=history, override=override, api_key_id=api_key_id)
    try:
        backend, scheduler = runtime.require()
    except NotReady as exc:
        raise TurnError(exc.code, str(exc)) from None
    starting = object()  # request ids are the client's: two sockets may use the same one
    _starting.add(starting)
    try:
        return await _turn_start(owner, prompt, send, given, backend, scheduler)
    finally:
        _starting.discard(starting)


async def _turn_start(
    owner: Owner, prompt, send: Send, given: _Given, backend: Backend, scheduler: Scheduler
) -> Turn:
    accepted_at = time.perf_counter()
    scheduler.expect()  # users arriving together are batched together
    submitted = False
    try:
        try:
            prepared = await sync_to_async(storage.closing_on_error)(
                _prepare, owner, prompt, backend, given
            )
        except DatabaseError as exc:
            log.warning("could not start %s: %s", prompt.request_id, exc)
            raise TurnError(
                "storage_failed",
                "the database is unavailable, so the prompt was not started; try again in a moment",
            ) from None
        run = _TurnRun(
            owner,
            prompt,
            prepared,
            send=send,
            backend=backend,
            scheduler=scheduler,
            accepted_at=accepted_at,
        )
        turn = run.turn
        if prepared.cache_key is not None:
            entry = await sync_to_async(completion_cache.get, thread_sensitive=False)(
                prepared.cache_key
            )
            # An entry whose record was erased is never served, even before Redis lets it go.
            if entry is not None and await sync_to_async(entry_servable)(
                key=prepared.cache_key, entry=entry
            ):
                await run.serve_cached(entry)
                return turn
            prometheus.CACHE_MISSES.inc()
        try:
            position = run.submit(prepared.request, expected=True)
            submitted = True
        except EngineError as exc:
            await sync_to_async(storage.store_answer)(
                turn.message_id, status=Message.Status.FAILED, error=str(exc)
            )
            raise TurnError(exc.code, str(exc)) from None
    finally:
        if not submitted:
            scheduler.unexpect()
    running_turns.add(turn)
    cancel_bus.ensure_listening()
    await turn.emit(
        accepted_event(
            turn.request_id,
            conversation=turn.conversation_id,
            message=turn.message_id,
            queue_position=position,
        )
    )
    # A fresh context: the turn outlives the request that started it (an HTTP view's
    # thread-sensitive executor is gone once the view returns).
    turn.task = asyncio.create_task(
        run.run(), name=f"turn-{turn.request_id}", context=contextvars.Context()
    )
    return turn


# -- cancelling a turn from any connection or process -------------------------------

running_turns = RunningTurns()
cancel_bus = CancelBus(running_turns.cancel_heard)
# Prompts accepted and not yet running (being stored, or looked up in the cache).
_starting: set[object] = set()


async def turns_drain(seconds: float) -> tuple[int, int]:
    """The process is stopping: let running answers finish for up to `seconds`, then cancel the
    rest and wait until every one is stored. Returns (finished, cancelled).

    Call it after `runtime.draining` is set, so no new turn starts meanwhile.
    """
    loop = asyncio.get_running_loop()
    running = len(running_turns.unfinished()) + len(_starting)
    deadline = loop.time() + seconds
    while (running_turns.unfinished() or _starting) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    # A turn being stored when time ran out is cancelled once it runs (its store is retried for
    # a few seconds at most; the cap only guards against waiting forever).
    deadline = loop.time() + 30
    while _starting and loop.time() < deadline:
        await asyncio.sleep(0.05)
    left = running_turns.unfinished()
    for turn in left:
        turn.cancel(SERVER_RESTARTING)
    tasks = [turn.task for turn in left if turn.task is not None]
    if tasks:
        # Cancelled within one decode step; the store retries a few seconds if the database is slow.
        await asyncio.wait(tasks, timeout=30)
    if left:
        log.warning("drain: cancelled %d unfinished answer(s), stored as cancelled", len(left))
    return running - len(left), len(left)


async def turn_cancel(*, owner: Owner, message_id: int) -> str:
    """Stop the owner's answer `message_id` wherever it runs.

    Returns "cancelled" (it ran here and was stopped), "sent" (it runs in another
    process, which was told), or "finished" (it had already ended: nothing to do).
    Raises TurnError `unknown_request` for an answer that is not the owner's or does
    not exist, and `cancel_unavailable` when another process cannot be reached.
    """
    status = await sync_to_async(answer_status)(owner, message_id)
    if status is None:
        raise TurnError("unknown_request", f"you have no answer {message_id}")
    if status != Message.Status.STREAMING:
        return "finished"
    turn = running_turns.get(message_id)
    if turn is not None:
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


# -- running a turn (async) --------------------------------------------------------


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


class _TurnRun:
    """Drives one turn to its end: owns its ticket, events and backend; forwards chunks through
    the policy gate, re-asks, stores, and caches."""

    def __init__(
        self,
        owner: Owner,
        prompt,
        prepared: _Prepared,
        *,
        send: Send,
        backend: Backend,
        scheduler: Scheduler,
        accepted_at: float,
    ):
        self.turn = Turn(
            request_id=prompt.request_id,
            conversation_id=prepared.conversation.pk,
            message_id=prepared.assistant.pk,
            owner=owner,
            send=send,
            _run=self,
        )
        self.prompt_text = prepared.asked
        self.answer_so_far = prepared.answer_so_far
        self.policy = prepared.policy
        self.messages = prepared.messages
        self.rendered = prepared.rendered
        self.cache_key = prepared.cache_key
        self.request = prepared.request
        self.accepted_at = accepted_at
        self._backend = backend
        # Identical cacheable prompts in flight share one generation (engine/coalescing.py).
        self._scheduler = coalescer.sharing(scheduler, prepared.cache_key)
        self._ticket: Ticket | None = None
        self._events: asyncio.Queue = asyncio.Queue()
        self.started_at: float | None = None
        self.first_token_at: float | None = None
        self.first_visible_at: float | None = None
        self.held_at: float | None = None
        self.retracted: str | None = None
        self.cancel_reason = ""
        self.retries = 0
        self.new_tokens = prepared.tokens_so_far

    def submit(self, request: GenerationRequest, *, expected: bool = False) -> int:
        """Queue `request` (the first attempt or a re-ask); its queue position."""
        loop = asyncio.get_running_loop()

        def sink(event) -> None:  # called on the generation thread; must not block
            loop.call_soon_threadsafe(self._events.put_nowait, event)

        self._ticket, position = self._scheduler.submit(request, sink, expected=expected)
        self.request = request
        return position

    def stop(self, reason: str = "") -> None:
        self.cancel_reason = self.cancel_reason or reason
        self.request.cancel.set()  # also stops a re-ask that is about to be queued
        if self._ticket is not None:
            self._scheduler.cancel(self._ticket)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.turn.finished = True
            running_turns.remove(self.turn.message_id)

    async def serve_cached(self, entry: dict) -> None:
        """A hit: one `done` with cached=true, no queue, no generation; the message is stored as usual."""
        turn = self.turn
        await turn.emit(
            accepted_event(
                turn.request_id,
                conversation=turn.conversation_id,
                message=turn.message_id,
                queue_position=0,
            )
        )
        elapsed = _ms(time.perf_counter() - self.accepted_at)
        cached_metrics = metrics(
            queue_ms=0.0,
            ttft_ms=elapsed,
            ttfv_ms=elapsed,
            total_ms=elapsed,
            held_ms=None,
            new_tokens=0,
            tokens_per_s=0.0,
            prompt_tokens=len(self.request.input_ids),
            retries=0,
            cached_new_tokens=entry.get("new_tokens") or 0,
        )
        await turn.emit(
            done_event(
                turn.request_id,
                message=turn.message_id,
                text=entry["text"],
                json_value=entry.get("json"),
                finish_reason=entry["finish_reason"],
                cached=True,
                metrics=cached_metrics,
                reason=None,
                policy=self.policy.slug,
            )
        )
        turn.finished = True
        prometheus.observe_done(cached_metrics, entry["finish_reason"], cached=True)
        try:
            await sync_to_async(storage.closing_on_error)(
                storage.store_cached_answer,
                turn.message_id,
                entry.get("record"),
                text=entry["text"],
                status=Message.Status.DONE,
                finish_reason=entry["finish_reason"],
                metrics=cached_metrics,
                outcome="ok",
                json_value=entry.get("json"),
                raw_text=entry["text"],
            )
        except Exception:
            log.exception("could not store the cached answer of %s", turn.request_id)
            await turn.emit(
                error_event(
                    "storage_failed",
                    "the answer could not be saved; it will not appear in your history",
                    turn.request_id,
                )
            )

    async def _run(self) -> None:
        policy = self.policy
        while True:
            gate = gate_for(
                policy.mode, hooks=policy.hooks, schema=policy.schema, shown=self.answer_so_far
            )
            outcome_event = await self._generate(gate)
            if isinstance(outcome_event, Failed):
                return await self._fail(outcome_event, gate.shown)
            result = outcome_event.result
            self.new_tokens += result.new_tokens
            if self.retracted is not None:
                return await self._withdraw(result, gate.raw, self.retracted)
            if result.finish_reason == "cancelled" and gate.cut is None:
                return await self._finish(
                    result,
                    "cancelled",
                    text=gate.shown,
                    raw=gate.raw,
                    reason=self.cancel_reason,
                )
            actions, outcome = gate.finish()
            await self._apply(actions)
            if outcome.status == "ok":
                # What was shown plus what was held back: the whole text in every mode.
                return await self._finish(
                    result,
                    CUT if gate.cut else result.finish_reason,
                    text=gate.shown + outcome.held_text,
                    raw=gate.raw,
                    outcome="ok",
                    reason=gate.cut or "",
                    json_value=outcome.json,
                )
            if outcome.status == "moderated":
                return await self._withdraw(result, gate.raw, outcome.reason)
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
                INVALID,
                text=text,
                raw=gate.raw,
                outcome="invalid",
                reason=outcome.reason,
            )

    async def _withdraw(self, result, raw: str, reason: str) -> None:
        """A moderation veto: nothing is kept as the answer; the raw text is stored for review."""
        await self._finish(result, MODERATED, text="", raw=raw, outcome="moderated", reason=reason)

    async def _generate(self, gate):
        """Pump one generation's events through the gate; returns its Finished or Failed."""
        while True:
            event = await self._events.get()
            if isinstance(event, TextChunk):
                if self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                await self._apply(gate.feed(event.text))
            elif isinstance(event, Queued):
                await self.turn.emit(
                    queued_event(self.turn.request_id, queue_position=event.position)
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
                await turn.emit(chunk_event(turn.request_id, action.text))
            elif isinstance(action, Hold):
                self.held_at = self.held_at or time.perf_counter()
                await turn.emit(buffering_event(turn.request_id, action.reason))
            elif isinstance(action, Cut):
                # Not the user's cancel: the answer stands, cut short where it began to ramble.
                self._scheduler.cancel(self._ticket)
                await turn.emit(cut_event(turn.request_id, text=action.text, reason=action.reason))
            elif isinstance(action, Retract):
                self.retracted = action.reason
                # Not the user's cancel: the answer is withdrawn.
                self._scheduler.cancel(self._ticket)
                await turn.emit(retract_event(turn.request_id, action.reason))

    def _reask(self, bad_answer: str, reason: str) -> bool:
        """Queue another attempt with the validation error; False if it cannot fit."""
        messages = self.messages + [
            {"role": "assistant", "content": bad_answer},
            {"role": "user", "content": reask_message(reason, self.policy.schema)},
        ]
        backend = self._backend
        input_ids = backend.encode(messages)
        if len(input_ids) + self.request.max_new_tokens > backend.context_length:
            return False
        try:
            # The same cancel flag: a Stop during the re-ask stops it too.
            self.submit(replace(self.request, input_ids=input_ids, messages=messages))
        except EngineError:
            return False
        return True

    def _metrics(self, done_at: float, result) -> dict:
        decode = (result.finished_at - result.started_at) if result else None
        return metrics(
            queue_ms=_ms((self.started_at or done_at) - self.accepted_at),
            ttft_ms=_ms((self.first_token_at or done_at) - self.accepted_at),
            ttfv_ms=_ms((self.first_visible_at or done_at) - self.accepted_at),
            total_ms=_ms(done_at - self.accepted_at),
            held_ms=_ms(done_at - self.held_at) if self.held_at else None,
            new_tokens=self.new_tokens,
            tokens_per_s=round(result.new_tokens / decode, 2)
            if result and result.new_tokens and decode
            else 0.0,
            prompt_tokens=result.prompt_tokens if result else None,
            retries=self.retries,
        )

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
        done_metrics = self._metrics(done_at, result)
        status = Message.Status.CANCELLED if finish_reason == "cancelled" else Message.Status.DONE
        try:
            stored = await storage.answer_store(
                message_id=turn.message_id,
                request_id=turn.request_id,
                text=text,
                status=status,
                finish_reason=finish_reason,
                metrics=done_metrics,
                raw_text=raw,
                outcome=outcome,
                outcome_reason=reason,
                json_value=json_value,
                retries=self.retries,
                held_ms=done_metrics["held_ms"],
            )
            problem = (
                "the database is unavailable; the server keeps trying for a few minutes, until then it is "
                "missing from your history"
            )
        except Exception:
            log.exception("could not store the answer of %s", turn.request_id)
            stored, problem = False, "it will not appear in your history"
        if not stored:
            await turn.emit(
                error_event(
                    "storage_failed",
                    f"the answer was generated but could not be saved: {problem}",
                    turn.request_id,
                )
            )
        if finish_reason == MODERATED and self.retracted is None:
            # Vetoed only at the end: anything shown must still be withdrawn.
            await turn.emit(retract_event(turn.request_id, reason))
        await turn.emit(
            done_event(
                turn.request_id,
                message=turn.message_id,
                text=text,
                json_value=json_value,
                finish_reason=finish_reason,
                cached=False,
                metrics=done_metrics,
                reason=reason or None,
                policy=self.policy.slug,
            )
        )
        prometheus.observe_done(done_metrics, finish_reason, cached=False)
        if outcome == "ok" and finish_reason in CACHEABLE_FINISH and self.cache_key is not None:
            await self._remember(text, json_value, finish_reason, done_metrics)

    async def _remember(
        self, text: str, json_value, finish_reason: str, done_metrics: dict
    ) -> None:
        """Written after `done` went out, so caching never delays the answer."""
        try:
            await sync_to_async(review.answer_remember)(
                key=self.cache_key,
                conversation_id=self.turn.conversation_id,
                prompt=self.prompt_text,
                rendered_prompt=self.rendered,
                text=text,
                json_value=json_value,
                finish_reason=finish_reason,
                metrics=done_metrics,
                policy_id=self.policy.id,
                policy_slug=self.policy.slug,
                policy_version=self.policy.version,
                model_id=self._backend.model_id,
                require_review=self.policy.require_review,
            )
        except Exception:
            log.exception("could not record the cached answer of %s", self.turn.request_id)

    async def _fail(self, event: Failed, partial_text: str) -> None:
        turn = self.turn
        failed_metrics = self._metrics(event.at, None)
        try:
            await storage.answer_store(
                message_id=turn.message_id,
                request_id=turn.request_id,
                text=partial_text,
                status=Message.Status.FAILED,
                metrics=failed_metrics,
                error=event.error,
            )
        except Exception:
            log.exception("could not store the failure of %s", turn.request_id)
        prometheus.FAILURES.inc()
        await turn.emit(
            error_event(
                "model_error",
                "the model failed while answering; please try again",
                turn.request_id,
            )
        )
