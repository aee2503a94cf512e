"""A signed-in user's own chat settings (ChatSettings): read for every turn they start, written
by the settings page. A visitor has none."""

from __future__ import annotations

import contextlib

from ..models import ChatSettings
from . import policy_store
from .engine_routes import visible_policies
from .selectors import Owner


def settings_of(user) -> ChatSettings:
    """`user`'s settings, unsaved defaults if they never saved any."""
    found = ChatSettings.objects.select_related("default_policy").filter(user=user).first()
    return found if found is not None else ChatSettings(user=user)


def instructions_for(owner: Owner) -> str:
    """The custom instructions the model reads with `owner`'s turns; empty for a visitor."""
    if owner.user_id is None:
        return ""
    found = ChatSettings.objects.filter(user_id=owner.user_id).values_list(
        "instructions", flat=True
    )
    return (found.first() or "").strip()


def default_policy_slug(owner: Owner) -> str | None:
    """The policy `owner`'s new chats start with; None: the site's default (a visitor, nothing
    chosen, or the chosen policy since deleted)."""
    if owner.user_id is None:
        return None
    return (
        ChatSettings.objects.filter(
            user_id=owner.user_id,
            # One on an engine they may no longer use (a group left) is as if none was chosen.
            default_policy__in=visible_policies(owner.user_id).values("pk"),
        )
        .values_list("default_policy__slug", flat=True)
        .first()
    )


def settings_export(user) -> dict:
    """The settings as the account's export shows them."""
    found = settings_of(user)
    return {
        "custom_instructions": found.instructions,
        "default_policy": found.default_policy.slug if found.default_policy else None,
    }


def policy_for(owner: Owner, slug: str | None) -> policy_store.ResolvedPolicy:
    """The policy a prompt of `owner`'s that names `slug` runs under: that one, else the policy
    they chose for new chats, else the site's default (UnknownPolicy for a slug nobody
    configured, as policy_store.policy_for)."""
    if slug is None and (chosen := default_policy_slug(owner)) is not None:
        with contextlib.suppress(policy_store.UnknownPolicy):  # deleted a moment ago
            return policy_store.policy_for(chosen)
    return policy_store.policy_for(slug)
