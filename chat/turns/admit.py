"""`admit`: the one check-and-start sequence every transport calls (the socket, `/api`, `/v1`).

Rate checks, the connection's one-answer-at-a-time limit, the budgets (budget.py), the model's
readiness, then the turn
prepared (policy resolved, prompt limits checked, messages stored), served from the cache or
queued, and started. A refusal at any step is a TurnError whose code has its row in
chat/protocol/errors.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from dataclasses import dataclass, replace

from asgiref.sync import sync_to_async
from django.db import DatabaseError

from ..engine.types import EngineError
from ..infra import metrics as prometheus
from ..infra.runtime import NotReady, Serving, runtime
from ..models import Message, OutputPolicy
from ..protocol import API_KEY_REVOKED, Prompt, events
from ..stores import engine_routes, storage, user_settings
from ..stores.cache import completion_cache
from ..stores.policy_store import UnknownPolicy
from ..stores.review import entry_servable
from ..stores.selectors import Owner, apikey_active
from .budget import budget_check
from .continuation import prepare_continue
from .forgetting import conversation_tag
from .handle import Send, Turn
from .limits import turn_rate_check
from .prepare import Given, Prepared, own_settings, prepare_prompt
from .refusals import TurnError
from .run import TurnRun
from .running import cancel_bus, running_turns, starting

log = logging.getLogger(__name__)


async def admit(
    *,
    owner: Owner,
    prompt: Prompt,
    send: Send,
    address: str | None = None,
    running: Turn | None = None,
    given: Given | None = None,
) -> Turn:
    """Check and start one prompt; sends `accepted` and returns the running turn.

    `address` is a visitor's network address, rate-limited beside the owner. `running` is the
    connection's unfinished turn, if any: a second prompt meanwhile is `busy`. The OpenAI API
    gives `given` (its own history, policy override and API key). TurnError says why not.
    """
    given = given or Given()
    token = object()  # request ids are the client's: two sockets may use the same one
    starting.add(token)
    handoff = _Handoff()
    try:
        accepted_at = time.perf_counter()
        try:
            admission = await _admission_async(owner, prompt, given, address, running, handoff)
        except asyncio.CancelledError:
            handoff.abandon()
            raise
        return await _start(owner, admission, send, given, address, accepted_at)
    finally:
        starting.discard(token)


@dataclass(frozen=True)
class Admission:
    """A prompt checked, routed and prepared, with the engine that answers it, which expects
    it (`expect`), and its servable cache entry if it has one."""

    prompt: Prompt
    serving: Serving
    prepared: Prepared
    cached: dict | None


class _Handoff:
    """The admission from the thread to the loop. A cancel on the loop (the client gone) does
    not wait for the thread, which goes on: whichever side comes second withdraws the engine's
    `expect` of a prompt that will never be submitted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admission: Admission | None = None
        self._abandoned = False

    def deliver(self, admission: Admission) -> None:
        """In the thread, as the admission is made."""
        with self._lock:
            self._admission = admission
            abandoned = self._abandoned
        if abandoned:
            admission.serving.stack.unexpect()

    def abandon(self) -> None:
        """On the loop, when the wait for the thread was cancelled."""
        with self._lock:
            self._abandoned = True
            admission = self._admission
        if admission is not None:
            admission.serving.stack.unexpect()


def _admission(
    owner: Owner,
    prompt: Prompt,
    given: Given,
    address: str | None,
    running: Turn | None,
    handoff: _Handoff,
) -> Admission:
    """Everything before the turn starts that reads the database or Redis, in one call on the
    request's thread (each trip between the event loop and a thread is a hand-off of the GIL and
    a wake-up, several a request while 8 users arrive together; a Redis round trip on the loop
    holds up every stream). A refusal is a TurnError."""
    turn_rate_check(owner=owner, address=address)
    if running is not None:
        raise TurnError(
            "busy", f"request {running.request_id} is still running; wait for it or cancel it"
        )
    budget_check(owner.user_id, given.api_key_id, visitor=owner.rate_key, address=address)
    prompt, route = _routed(owner, prompt, given)
    try:  # a remote engine's first prompt builds it: a few questions to its server
        serving = runtime.serving(
            route.engine, route.fallback, fallback_default=route.fallback_default
        )
    except NotReady as exc:
        raise TurnError(exc.code, str(exc)) from None
    serving.stack.expect()  # users arriving together are batched together
    try:
        prepared = _prepared(owner, prompt, serving, given, route.policy)
        cached = _servable_entry(prepared.cache_key)
    except BaseException:
        serving.stack.unexpect()
        raise
    admission = Admission(prompt, serving, prepared, cached)
    handoff.deliver(admission)
    return admission


_admission_async = sync_to_async(_admission)


def _routed(owner: Owner, prompt: Prompt, given: Given) -> tuple[Prompt, engine_routes.Route]:
    """`prompt` naming the policy it runs under (a page or /api prompt that names none: the
    one its user chose for new chats, if any), and that policy's engines; a TurnError when the
    policy is not the user's (unknown_policy) or the database is unavailable."""
    try:
        if prompt.policy is None and prompt.continues is None and own_settings(given):
            chosen = storage.closing_on_error(user_settings.default_policy_slug, owner)
            if chosen is not None:
                prompt = replace(prompt, policy=chosen)
        return prompt, storage.closing_on_error(engine_routes.route_for, owner.user_id, prompt)
    except UnknownPolicy as exc:
        raise TurnError(exc.code, str(exc)) from None
    except DatabaseError as exc:
        raise _storage_failed("route", prompt, exc) from None


def _prepared(
    owner: Owner, prompt: Prompt, serving: Serving, given: Given, routed: OutputPolicy | None
) -> Prepared:
    """The prompt's messages stored and its request built (prepare.py, continuation.py)."""
    try:
        if prompt.continues is not None:
            return storage.closing_on_error(
                prepare_continue, owner, prompt, serving.backend, engine=serving.engine
            )
        return storage.closing_on_error(
            prepare_prompt,
            owner,
            prompt,
            serving.backend,
            given,
            engine=serving.engine,
            routed=routed,
        )
    except DatabaseError as exc:
        raise _storage_failed("start", prompt, exc) from None


def _storage_failed(doing: str, prompt: Prompt, exc: DatabaseError) -> TurnError:
    log.warning("could not %s %s: %s", doing, prompt.request_id, exc)
    return TurnError(
        "storage_failed",
        "the database is unavailable, so the prompt was not started; try again in a moment",
    )


def _servable_entry(cache_key: str | None) -> dict | None:
    """The cached answer under `cache_key` if one may be served. An entry whose record was
    erased, rejected or evicted is never served, even before Redis lets it go."""
    if cache_key is None:
        return None
    entry = completion_cache.get(cache_key)
    if entry is not None and entry_servable(key=cache_key, entry=entry):
        return entry
    prometheus.CACHE_MISSES.inc()
    return None


async def _start(
    owner: Owner,
    admission: Admission,
    send: Send,
    given: Given,
    address: str | None,
    accepted_at: float,
) -> Turn:
    prompt, prepared, stack = admission.prompt, admission.prepared, admission.serving.stack
    submitted = False
    try:
        run = TurnRun(
            owner,
            prompt,
            prepared,
            send=send,
            backend=admission.serving.backend,
            stack=stack,
            accepted_at=accepted_at,
            serving=admission.serving,
        )
        turn = run.turn
        turn.api_key_id = given.api_key_id
        turn.address = address if owner.user_id is None else None
        # What the engine keeps of it is filed under its conversation, for when that is deleted.
        run.request.tag = conversation_tag(prepared.conversation.pk)
        if admission.cached is not None:
            await run.serve_cached(admission.cached)
            return turn
        try:
            position = run.submit(prepared.request, expected=True)
            submitted = True
        except EngineError as exc:
            await sync_to_async(storage.answer_write)(
                turn.message_id, status=Message.Status.FAILED, error=str(exc)
            )
            raise TurnError(exc.code, str(exc)) from None
    finally:
        if not submitted:
            stack.unexpect()
    running_turns.add(turn)
    cancel_bus.ensure_listening()
    if turn.api_key_id is not None and not await sync_to_async(apikey_active)(turn.api_key_id):
        # Revoked while this turn was prepared, before a revocation's cancel could find it.
        turn.cancel(API_KEY_REVOKED)
    await turn.emit(
        events.Accepted(
            turn.request_id,
            conversation=turn.conversation_id,
            message=turn.message_id,
            queue_position=position,
            text_before=turn.text_before if prompt.continues is not None else None,
        )
    )
    # A fresh context: the turn outlives the request that started it (an HTTP view's
    # thread-sensitive executor is gone once the view returns).
    turn.task = asyncio.create_task(
        run.run(), name=f"turn-{turn.request_id}", context=contextvars.Context()
    )
    return turn
