"""The end of a turn (async): the answer stored as its message, `done` sent, the answer counted
in the process's metrics and cached when it may be; or a failed generation stored and reported.

`TurnFinish` is the part of `TurnRun` (run.py) that ends a turn; a staff trial (trial.py)
overrides its storing, counting and caching to keep the answer for staff instead.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from enum import StrEnum

from asgiref.sync import sync_to_async

from ..engine.types import Backend, Failed
from ..infra import metrics as prometheus
from ..infra.engines import ENGINE_UNAVAILABLE, EngineSpec
from ..infra.runtime import runtime
from ..models import Message
from ..protocol import events, metrics
from ..protocol.events import Finish
from ..stores import review, storage
from ..stores.cache import CACHEABLE_FINISH
from ..stores.partial import PartialSaver
from ..stores.policy_store import ResolvedPolicy
from .budget import answer_charge, visitor_charge
from .handle import Turn

log = logging.getLogger(__name__)


class Verdict(StrEnum):
    """The policy gate's verdict on a finished generation (chat/policy `Outcome.status`)."""

    OK = "ok"
    INVALID = "invalid"
    MODERATED = "moderated"


def to_ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


class TurnFinish:
    """Ends a turn: stores, reports, counts and caches its answer, or stores its failure. Mixed
    into `TurnRun`, whose state it reads (declared here)."""

    turn: Turn
    policy: ResolvedPolicy
    prompt_text: str
    rendered: str
    cache_key: str | None
    accepted_at: float
    started_at: float | None
    first_token_at: float | None
    first_visible_at: float | None
    held_at: float | None
    retracted: str | None
    retries: int
    new_tokens: int
    tokens_before: int  # a Continue's answer so far, charged when it was generated
    _backend: Backend
    _saver: PartialSaver | None
    engine: EngineSpec | None  # the engine row answering; None: the default engine
    fallback: bool  # it stands in for the policy's own engine

    def engine_metrics(self) -> dict:
        """Which engine answered, for `done`'s metrics: its name, its model, as a fallback?"""
        return {
            "engine": self.engine.name if self.engine is not None else "default",
            "model": self._backend.model_id,
            "fallback": self.fallback,
        }

    async def _saver_close(self) -> None:
        if self._saver is not None:
            await self._saver.close()

    def _metrics(self, done_at: float, result) -> dict:
        decode = (result.finished_at - result.started_at) if result else None
        return metrics(
            queue_ms=to_ms((self.started_at or done_at) - self.accepted_at),
            ttft_ms=to_ms((self.first_token_at or done_at) - self.accepted_at),
            ttfv_ms=to_ms((self.first_visible_at or done_at) - self.accepted_at),
            total_ms=to_ms(done_at - self.accepted_at),
            held_ms=to_ms(done_at - self.held_at) if self.held_at else None,
            new_tokens=self.new_tokens,
            tokens_per_s=round(result.new_tokens / decode, 2)
            if result and result.new_tokens and decode
            else 0.0,
            prompt_tokens=result.prompt_tokens if result else None,
            retries=self.retries,
            **self.engine_metrics(),
        )

    async def _finish(
        self,
        result,
        finish_reason: Finish,
        *,
        text: str,
        raw: str,
        outcome: Verdict | str = "",
        reason: str = "",
        json_value=None,
        masked: str | None = None,
        explanation: dict[str, str] | None = None,
    ) -> None:
        turn = self.turn
        done_at = time.perf_counter()
        done_metrics = self._metrics(done_at, result)
        if masked:
            done_metrics["masked"] = masked  # the stored raw text is masked too: the only trace
        await self._store(
            text=text,
            finish_reason=finish_reason,
            done_metrics=done_metrics,
            raw=raw,
            outcome=outcome,
            reason=reason,
            json_value=json_value,
            explanation=explanation,
        )
        # Charged before `done` goes out, so a client's next prompt is checked against it.
        await self._charge(done_metrics)
        if finish_reason is Finish.MODERATED and self.retracted is None:
            # Vetoed only at the end: anything shown must still be withdrawn.
            await turn.emit(events.Retract(turn.request_id, reason))
        await turn.emit_last(
            events.Done(
                turn.request_id,
                message=turn.message_id,
                text=text,
                json_value=json_value,
                finish_reason=finish_reason,
                cached=False,
                metrics=done_metrics,
                reason=reason or None,
                policy=self.policy.slug,
                explanation=explanation,
            )
        )
        await self._account(text, json_value, finish_reason, outcome, done_metrics)

    def charged_tokens(self) -> int:
        """The tokens generated for this answer times its engine's cost weight (budgets count
        these), rounded up: a weighted engine's one token is never free."""
        generated = self.new_tokens - self.tokens_before
        weight = self.engine.cost_weight if self.engine is not None else 1.0
        return generated if weight == 1.0 else math.ceil(generated * weight)

    async def _charge(self, done_metrics: dict) -> None:
        """The tokens generated for this answer charged to its user's and key's budgets, or to a
        visitor's session and address."""
        if self.turn.owner.user_id is None:
            try:  # a visitor's budget is counted in Redis only
                await asyncio.to_thread(
                    visitor_charge,
                    self.turn.owner.rate_key,
                    self.turn.address,
                    self.charged_tokens(),
                )
            except Exception:
                log.exception("could not charge the answer of %s", self.turn.request_id)
            return
        try:
            await answer_charge(
                user_id=self.turn.owner.user_id,
                api_key_id=self.turn.api_key_id,
                policy=self.policy.slug,
                tokens=self.charged_tokens(),
                prompt_tokens=done_metrics.get("prompt_tokens") or 0,
                engine=self.engine.name if self.engine is not None else "",
            )
        except Exception:  # the answer is stored and goes out all the same
            log.exception("could not charge the answer of %s", self.turn.request_id)

    async def _store(
        self,
        *,
        text: str,
        finish_reason: Finish,
        done_metrics: dict,
        raw: str,
        outcome: Verdict | str,
        reason: str,
        json_value,
        explanation: dict[str, str] | None,
    ) -> None:
        """The answer stored as the turn's message; the client told when that failed."""
        turn = self.turn
        await self._saver_close()  # no save of the text so far after the final one
        status = (
            Message.Status.CANCELLED if finish_reason is Finish.CANCELLED else Message.Status.DONE
        )
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
                explanation=explanation,
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
                events.Error(
                    turn.request_id,
                    "storage_failed",
                    f"the answer was generated but could not be saved: {problem}",
                )
            )

    async def _account(
        self, text: str, json_value, finish_reason: Finish, outcome: Verdict | str, done_metrics
    ) -> None:
        """After `done`: the answer counted in the process's metrics, and cached when it may be."""
        prometheus.observe_done(done_metrics, finish_reason, cached=False)
        if self.engine is not None and runtime.engines.seen_due(self.engine):
            await asyncio.to_thread(runtime.engines.seen, self.engine)  # the admin's "last seen"
        if (
            outcome is Verdict.OK
            and finish_reason in CACHEABLE_FINISH
            and self.cache_key is not None
        ):
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
        await self._saver_close()
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
        if event.code == ENGINE_UNAVAILABLE:
            if self.engine is not None:  # refused at once for a while, or sent to its fallback
                await asyncio.to_thread(runtime.engines.failed, self.engine, event.error)
            name = self.engine.name if self.engine is not None else "the model's server"
            await turn.emit_last(
                events.Error(
                    turn.request_id,
                    ENGINE_UNAVAILABLE,
                    f"{name} stopped answering; what it wrote is kept, try again in a moment",
                )
            )
            return
        await turn.emit_last(
            events.Error(
                turn.request_id, "model_error", "the model failed while answering; please try again"
            )
        )
