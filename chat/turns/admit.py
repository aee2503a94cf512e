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
import time
from dataclasses import replace

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
    turn_rate_check(owner=owner, address=address)
    if running is not None:
        raise TurnError(
            "busy", f"request {running.request_id} is still running; wait for it or cancel it"
        )
    given = given or Given()
    await sync_to_async(budget_check)(
        owner.user_id, given.api_key_id, visitor=owner.rate_key, address=address
    )
    prompt, route, serving = await _serving(owner, prompt, given)
    token = object()  # request ids are the client's: two sockets may use the same one
    starting.add(token)
    try:
        return await _start(owner, prompt, send, given, serving, address, route.policy)
    finally:
        starting.discard(token)


def _routed(owner: Owner, prompt: Prompt, given: Given) -> tuple[Prompt, engine_routes.Route]:
    """`prompt` naming the policy it runs under (a page or /api prompt that names none: the
    one its user chose for new chats, if any), and that policy's engines."""
    if prompt.policy is None and prompt.continues is None and own_settings(given):
        chosen = user_settings.default_policy_slug(owner)
        if chosen is not None:
            prompt = replace(prompt, policy=chosen)
    return prompt, engine_routes.route_for(owner.user_id, prompt)


async def _serving(
    owner: Owner, prompt: Prompt, given: Given
) -> tuple[Prompt, engine_routes.Route, Serving]:
    """The engine that answers `prompt`'s policy (engine_routes.py), its fallback while it is
    down, or a TurnError: the policy is not the user's (unknown_policy) or nothing can answer."""
    try:
        prompt, route = await sync_to_async(_routed)(owner, prompt, given)
    except UnknownPolicy as exc:
        raise TurnError(exc.code, str(exc)) from None
    except DatabaseError as exc:
        log.warning("could not route %s: %s", prompt.request_id, exc)
        raise TurnError(
            "storage_failed",
            "the database is unavailable, so the prompt was not started; try again in a moment",
        ) from None
    try:
        if route.engine is None and route.fallback is None:
            serving = runtime.serving(None)
        else:  # A remote engine's first prompt builds it: a few questions to its server.
            serving = await sync_to_async(runtime.serving, thread_sensitive=False)(
                route.engine, route.fallback, fallback_default=route.fallback_default
            )
    except NotReady as exc:
        raise TurnError(exc.code, str(exc)) from None
    return prompt, route, serving


def _prepare(
    owner: Owner, prompt: Prompt, serving: Serving, given: Given, routed: OutputPolicy | None
) -> Prepared:
    if prompt.continues is not None:
        return prepare_continue(owner, prompt, serving.backend, engine=serving.engine)
    return prepare_prompt(
        owner, prompt, serving.backend, given, engine=serving.engine, routed=routed
    )


async def _start(
    owner: Owner,
    prompt: Prompt,
    send: Send,
    given: Given,
    serving: Serving,
    address: str | None,
    routed: OutputPolicy | None,
) -> Turn:
    stack = serving.stack
    accepted_at = time.perf_counter()
    stack.expect()  # users arriving together are batched together
    submitted = False
    try:
        try:
            prepared = await sync_to_async(storage.closing_on_error)(
                _prepare, owner, prompt, serving, given, routed
            )
        except DatabaseError as exc:
            log.warning("could not start %s: %s", prompt.request_id, exc)
            raise TurnError(
                "storage_failed",
                "the database is unavailable, so the prompt was not started; try again in a moment",
            ) from None
        run = TurnRun(
            owner,
            prompt,
            prepared,
            send=send,
            backend=serving.backend,
            stack=stack,
            accepted_at=accepted_at,
            serving=serving,
        )
        turn = run.turn
        turn.api_key_id = given.api_key_id
        turn.address = address if owner.user_id is None else None
        # What the engine keeps of it is filed under its conversation, for when that is deleted.
        run.request.tag = conversation_tag(prepared.conversation.pk)
        if prepared.cache_key is not None:
            entry = await sync_to_async(completion_cache.get, thread_sensitive=False)(
                prepared.cache_key
            )
            # An entry whose record was erased, rejected or evicted is never served, even before
            # Redis lets it go.
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
