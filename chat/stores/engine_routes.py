"""Which engine answers a policy, and who may use it.

A policy names its engine (none: the default engine) and optionally a fallback: another
engine, or the default one (which has no row: `fallback_to_default`). An engine with
groups is only for their members: a policy on it is invisible to everyone else, so the page's
picker, `/api`, the socket and `/v1` all answer as if it did not exist (`unknown_policy`,
`model_not_found`). An engine without groups, and the default engine, are everyone's.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet

from ..infra.engines import EngineSpec
from ..models import Engine, Message, OutputPolicy
from ..protocol import Prompt
from .policy_store import UnknownPolicy


@dataclass(frozen=True)
class Route:
    """The engine a policy's turn asks first (None: the default) and its fallback, if usable."""

    engine: EngineSpec | None = None
    fallback: EngineSpec | None = None
    fallback_default: bool = False  # the default engine is the fallback (it has no row)
    # The policy row read to route it, for the turn to run under without reading it again
    # (None: no such policy; the turn's own lookup says why, or falls back to the built-in).
    policy: OutputPolicy | None = None


def usable_engines(user_id: int | None) -> QuerySet[Engine]:
    """The engine rows `user_id` may use (a visitor, None: those without groups)."""
    allowed = Q(groups__isnull=True)
    if user_id is not None:
        allowed |= Q(groups__user__id=user_id)
    return Engine.objects.filter(allowed).distinct()


def visible_policies(user_id: int | None) -> QuerySet[OutputPolicy]:
    """The policies `user_id` may see and use: on the default engine or one they may use."""
    return OutputPolicy.objects.filter(
        Q(engine__isnull=True) | Q(engine__in=usable_engines(user_id).values("pk"))
    )


def route_for(user_id: int | None, prompt: Prompt) -> Route:
    """The engines for `prompt`'s policy (a Continue's: its answer's); UnknownPolicy when the
    user may not use its engine. A slug nobody configured is left to the turn's own check."""
    # The policy alone: most answer on the default engine, and joining the engine tables cost
    # every prompt more than the rare policy with engines pays in a query of its own below.
    if prompt.continues is not None:
        policy = OutputPolicy.objects.filter(
            pk=Message.objects.filter(pk=prompt.continues).values("policy_id")[:1]
        ).first()
    elif prompt.policy is not None:
        policy = OutputPolicy.objects.filter(slug=prompt.policy).first()
    else:
        policy = OutputPolicy.objects.filter(is_default=True).first()
    if policy is None or (policy.engine_id is None and policy.fallback_engine_id is None):
        return Route(policy=policy)
    # The engines among the two that the user may use, rows and all, in one query.
    usable = {
        engine.pk: engine
        for engine in usable_engines(user_id).filter(
            pk__in=[policy.engine_id, policy.fallback_engine_id]
        )
    }
    if policy.engine_id is not None and policy.engine_id not in usable:
        if prompt.policy is None:
            raise UnknownPolicy("the default policy is not available to you; name a policy")
        raise UnknownPolicy(f"no output policy {prompt.policy!r} for you")
    engine = usable.get(policy.engine_id)
    fallback = (
        None
        if policy.fallback_engine_id == policy.engine_id
        else usable.get(policy.fallback_engine_id)
    )
    return Route(
        fallback_default=policy.fallback_to_default and policy.engine_id is not None,
        engine=EngineSpec.of(engine) if engine is not None else None,
        fallback=EngineSpec.of(fallback) if fallback is not None else None,
        policy=policy,
    )
