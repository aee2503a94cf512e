"""Running one turn (async): the engine's events through the policy gate to the client, re-asks,
then the answer stored and cached (finish.py). Branches on typed values (`Verdict`, `Finish`, the
policy's `OutputPolicy.Mode` and `FailureAction`), not strings."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from asgiref.sync import sync_to_async
from django.conf import settings

from ..engine.stack import SchedulerStack
from ..engine.types import (
    Backend,
    EngineError,
    Failed,
    Finished,
    GenerationRequest,
    Queued,
    Reading,
    Started,
    TextChunk,
    Ticket,
)
from ..infra import metrics as prometheus
from ..infra.engines import ENGINE_UNAVAILABLE
from ..infra.runtime import NotReady, Serving, runtime
from ..models import Message, OutputPolicy
from ..policy import Cut, Emit, Hold, Retract, gate_for, reask_message, reask_tool_message
from ..policy.explanation import explain
from ..protocol import Prompt, events, metrics
from ..protocol.events import Finish
from ..stores import storage
from ..stores.partial import PartialSaver
from ..stores.selectors import Owner
from .budget import answer_charge
from .finish import TurnFinish, Verdict, to_ms
from .handle import Send, Turn
from .inbox import ChunkQueue, EventInbox
from .journal import Journal
from .prepare import Prepared
from .running import running_turns

log = logging.getLogger(__name__)


class TurnRun(TurnFinish):
    """Drives one turn to its end: owns its ticket, events and backend; forwards chunks through
    the policy gate, re-asks; then stores and caches (`TurnFinish`, finish.py)."""

    def __init__(
        self,
        owner: Owner,
        prompt: Prompt,
        prepared: Prepared,
        *,
        send: Send,
        backend: Backend,
        stack: SchedulerStack,
        accepted_at: float,
        serving: Serving | None = None,
    ):
        self.turn = Turn(
            request_id=prompt.request_id,
            conversation_id=prepared.conversation.pk,
            message_id=prepared.assistant.pk,
            owner=owner,
            send=send,
            policy=prepared.policy.slug,
            grace_s=settings.CHAT_RESUME_GRACE_S,
            text_before=prepared.answer_so_far,
            # A staff trial (trial.py) has no stored message: nothing to number, keep or save.
            journal=(
                Journal(prepared.assistant.pk, resumable=prepared.conversation.api_key_id is None)
                if prepared.assistant.pk is not None
                else None
            ),
            _run=self,
        )
        # The text shown so far, saved as it grows: what a crash must not take away.
        self._saver = (
            PartialSaver(prepared.assistant.pk, saved=prepared.answer_so_far)
            if prepared.assistant.pk is not None
            else None
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
        # The engine row answering (None: the default engine), and whether as a fallback.
        self.engine = serving.engine if serving is not None else None
        self.fallback = serving.fallback if serving is not None else False
        # The policy's fallback, while this engine may still stop before anything was shown.
        self._standby = serving.standby if serving is not None else None
        # Cacheable answers of one identity in flight share one generation (chat/engine/stack.py):
        # a policy that caches nothing shares nothing.
        self._scheduler = stack.for_answer(prepared.cache_key)
        self._ticket: Ticket | None = None
        self._events: asyncio.Queue = ChunkQueue()
        self.started_at: float | None = None
        self.first_token_at: float | None = None
        self.first_visible_at: float | None = None
        self.held_at: float | None = None
        self.retracted: str | None = None
        self.cancel_reason = ""
        self.retries = 0
        self.new_tokens = prepared.tokens_so_far
        self.tokens_before = prepared.tokens_so_far

    def submit(self, request: GenerationRequest, *, expected: bool = False) -> int:
        """Queue `request` (the first attempt or a re-ask); its queue position."""
        inbox = EventInbox(asyncio.get_running_loop(), self._events)
        self._ticket, position = self._scheduler.submit(request, inbox.sink, expected=expected)
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
            await self._saver_close()
            self.turn.finished = True
            running_turns.remove(self.turn.message_id)

    async def serve_cached(self, entry: dict) -> None:
        """A hit: one `done` with cached=true, no queue, no generation; the message is stored as usual."""
        turn = self.turn
        await turn.emit(
            events.Accepted(
                turn.request_id,
                conversation=turn.conversation_id,
                message=turn.message_id,
                queue_position=0,
            )
        )
        elapsed = to_ms(time.perf_counter() - self.accepted_at)
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
            **self.engine_metrics(),
        )
        await turn.emit_last(
            events.Done(
                turn.request_id,
                message=turn.message_id,
                text=entry["text"],
                json_value=entry.get("json"),
                finish_reason=Finish(entry["finish_reason"]),
                cached=True,
                metrics=cached_metrics,
                reason=None,
                policy=self.policy.slug,
            )
        )
        prometheus.observe_done(cached_metrics, entry["finish_reason"], cached=True)
        try:
            await sync_to_async(storage.closing_on_error)(
                storage.cached_answer_write,
                turn.message_id,
                entry.get("record"),
                text=entry["text"],
                status=Message.Status.DONE,
                finish_reason=entry["finish_reason"],
                metrics=cached_metrics,
                outcome=Verdict.OK,
                json_value=entry.get("json"),
                raw_text=entry["text"],
            )
        except Exception:
            log.exception("could not store the cached answer of %s", turn.request_id)
            await turn.emit(
                events.Error(
                    turn.request_id,
                    "storage_failed",
                    "the answer could not be saved; it will not appear in your history",
                )
            )
        try:  # counted apart, charged nothing (chat/turns/budget.py)
            await answer_charge(
                user_id=turn.owner.user_id,
                api_key_id=turn.api_key_id,
                policy=self.policy.slug,
                tokens=0,
                prompt_tokens=cached_metrics["prompt_tokens"] or 0,
                cached=True,
                engine=self.engine.name if self.engine is not None else "",
            )
        except Exception:
            log.exception("could not record the cache hit of %s", turn.request_id)

    async def _run(self) -> None:
        policy = self.policy
        while True:
            gate = gate_for(
                policy.mode,
                hooks=policy.hooks,
                schema=policy.schema,
                holdback_chars=policy.holdback_chars,
                shown=self.answer_so_far,
                tools=policy.tools,
            )
            outcome_event = await self._generate(gate)
            if isinstance(outcome_event, Failed):
                if not gate.shown and await self._stand_in(outcome_event):
                    continue
                return await self._fail(outcome_event, gate.shown)
            result = outcome_event.result
            self.new_tokens += result.new_tokens
            if self.retracted is not None:
                return await self._withdraw(result, gate.raw, self.retracted)
            if result.finish_reason == Finish.CANCELLED and gate.cut is None:
                return await self._finish(
                    result,
                    Finish.CANCELLED,
                    text=gate.shown,
                    raw=gate.raw,
                    reason=self.cancel_reason,
                )
            actions, outcome = await self._judging(gate.finish)
            await self._apply(actions)
            verdict = Verdict(outcome.status)
            if verdict is Verdict.OK:
                # What was shown plus what was held back: the whole text in every mode.
                return await self._finish(
                    result,
                    Finish.CUT if gate.cut else Finish(result.finish_reason),
                    text=gate.shown + outcome.held_text,
                    raw=gate.raw,
                    outcome=Verdict.OK,
                    reason=gate.cut or "",
                    json_value=outcome.json,
                    masked=gate.masked,
                )
            if verdict is Verdict.MODERATED:
                return await self._withdraw(result, gate.raw, outcome.reason)
            self._count_invalid()
            # invalid: nothing was shown in buffer mode, so the model may try again
            if (
                policy.mode == OutputPolicy.Mode.BUFFER
                and self.retries < policy.max_retries
                and self._reask(gate.text, outcome.reason)
            ):
                self.retries += 1
                continue
            fallback = policy.failure_action == OutputPolicy.FailureAction.FALLBACK
            text = policy.fallback_text if fallback else gate.shown
            return await self._finish(
                result,
                Finish.INVALID,
                text=text,
                raw=gate.raw,
                outcome=Verdict.INVALID,
                reason=outcome.reason,
                explanation=self._explain(Verdict.INVALID, outcome.reason, gate.raw),
            )

    async def _stand_in(self, failed: Failed) -> bool:
        """The engine stopped answering before any of its text reached the client: the policy's
        fallback answers from the start instead, and `done` says so (metrics `fallback`). False
        when there is no fallback or it cannot answer either; then the turn fails as before.
        The answer is neither cached nor shared: its identity named the first engine."""
        standby, self._standby = self._standby, None
        if (
            standby is None
            or failed.code != ENGINE_UNAVAILABLE
            or self.retracted is not None
            or self.request.cancel.is_set()
        ):
            return False
        if self.engine is not None:  # refused at once for a while, as after any failure
            await asyncio.to_thread(runtime.engines.failed, self.engine, failed.error)
        try:
            serving = await asyncio.to_thread(standby)
            # This attempt's messages (a re-ask's carry the answer it corrects).
            messages = self.request.messages or self.messages
            input_ids = await asyncio.to_thread(serving.backend.encode, messages)
        except NotReady as exc:
            log.info("%s: the fallback cannot answer either (%s)", self.turn.request_id, exc)
            return False
        if len(input_ids) + self.request.params.max_new_tokens > serving.backend.context_length:
            return False
        log.info(
            "%s: %s stopped answering before anything was shown; %s answers instead",
            self.turn.request_id,
            self.engine.name if self.engine is not None else "the default engine",
            serving.engine.name if serving.engine is not None else "the default engine",
        )
        self._backend, self.engine, self.fallback = serving.backend, serving.engine, True
        self.cache_key = None
        self._scheduler = serving.stack.for_answer(None)
        self.first_token_at = None
        try:
            self.submit(replace(self.request, input_ids=input_ids, messages=messages))
        except EngineError:
            return False
        return True

    def _count_invalid(self) -> None:
        prometheus.VALIDATION_FAILURES.inc()

    async def _withdraw(self, result, raw: str, reason: str) -> None:
        """A moderation veto: nothing is kept as the answer; the raw text is stored for review."""
        await self._finish(
            result,
            Finish.MODERATED,
            text="",
            raw=raw,
            outcome=Verdict.MODERATED,
            reason=reason,
            explanation=self._explain(Verdict.MODERATED, reason, raw),
        )

    def _explain(self, verdict: Verdict, reason: str, raw: str) -> dict[str, str]:
        policy = self.policy
        return explain(
            verdict,
            policy=policy.slug,
            reason=reason,
            schema=policy.schema,
            about=policy.description,
            raw=raw,
            show_raw=policy.show_failed_text,
        )

    async def _generate(self, gate):
        """Pump one generation's events through the gate; returns its Finished or Failed."""
        while True:
            event = await self._events.get()
            if isinstance(event, TextChunk):
                if self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                await self._apply(await self._judging(gate.feed, event.text))
                if self._saver is not None:
                    self._saver.note("" if self.retracted is not None else gate.shown)
            elif isinstance(event, Queued):
                await self.turn.emit(
                    events.Queued(self.turn.request_id, queue_position=event.position)
                )
            elif isinstance(event, Reading):
                await self.turn.emit(
                    events.Reading(
                        self.turn.request_id, tokens_read=event.done, prompt_tokens=event.total
                    )
                )
            elif isinstance(event, Started):
                self.started_at = self.started_at or event.at
            elif isinstance(event, (Finished, Failed)):
                return event

    async def _judging(self, call, *args):
        """Run a gate step; off the event loop when a hook waits on a service (a remote
        moderation endpoint, a guard model), so other turns keep streaming meanwhile."""
        if any(hook.blocking for hook in self.policy.hooks):
            return await asyncio.to_thread(call, *args)
        return call(*args)

    async def _apply(self, actions) -> None:
        turn = self.turn
        for action in actions:
            if isinstance(action, Emit):
                self.first_visible_at = self.first_visible_at or time.perf_counter()
                await turn.emit(events.Chunk(turn.request_id, action.text))
            elif isinstance(action, Hold):
                self.held_at = self.held_at or time.perf_counter()
                await turn.emit(events.Buffering(turn.request_id, action.reason))
            elif isinstance(action, Cut):
                # Not the user's cancel: the answer stands, cut short where it began to ramble.
                self._scheduler.cancel(self._ticket)
                await turn.emit(events.Cut(turn.request_id, text=action.text, reason=action.reason))
            elif isinstance(action, Retract):
                self.retracted = action.reason
                # Not the user's cancel: the answer is withdrawn.
                self._scheduler.cancel(self._ticket)
                await turn.emit(events.Retract(turn.request_id, action.reason))

    def _reask(self, bad_answer: str, reason: str) -> bool:
        """Queue another attempt with the validation error; False if it cannot fit."""
        messages = self.messages + [
            {"role": "assistant", "content": bad_answer},
            {
                "role": "user",
                "content": reask_tool_message(reason)
                if self.policy.tools is not None
                else reask_message(reason, self.policy.schema),
            },
        ]
        backend = self._backend
        input_ids = backend.encode(messages)
        if len(input_ids) + self.request.params.max_new_tokens > backend.context_length:
            return False
        try:
            # The same cancel flag: a Stop during the re-ask stops it too.
            self.submit(replace(self.request, input_ids=input_ids, messages=messages))
        except EngineError:
            return False
        return True
