"""What a deleted conversation leaves in the engine, and forgetting it.

Two things outlive a conversation's rows. The prefix store (chat/engine/local/prefix_store.py) keeps
the KV of recent rows by their token ids in each process that ran them, and whether a new
prompt reuses them shows in its speed; a shared generation's events (chat/engine/
sharing/generation_registry.py) stay in the cache's Redis for a while after it ends. Both are filed
under the tag every turn's request carries (`GenerationRequest.tag`, set by admit): the
conversation's id under an HMAC keyed with SECRET_KEY, so nothing the engine keeps or the bus
carries names a conversation. The engine knows no Django: it is handed tags and plain methods
(`PrefixStore.forget`, `GenerationRegistry.forget`) are called from here.

The deletion itself (chat/stores/erasure.py) calls `turns.conversations_forget` after its commit,
which forgets here, tells every other process over the cancel bus, and clears Redis once.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable

from django.conf import settings

from ..engine.sharing.coalescing_across import AcrossProcesses
from ..engine.sharing.generation_registry import GenerationRegistry
from ..infra.runtime import runtime

log = logging.getLogger(__name__)


def conversation_tag(conversation_id: int) -> str:
    """The opaque tag of a conversation's requests: the same in every process of one site."""
    message = f"chat-conversation:{conversation_id}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()[:32]


def prefix_forget(tags: Iterable[str]) -> int:
    """Drop this process's prefix KV filed under `tags` (a remote backend keeps none); how many
    entries went."""
    store = getattr(runtime.backend, "prefix_store", None)
    if store is None:
        return 0
    dropped = store.forget(tags)
    if dropped:
        log.info("forgot %d prefix entries of deleted conversations", dropped)
    return dropped


def streams_forget(tags: Iterable[str]) -> int:
    """Delete the shared generations filed under `tags` that no living conversation holds (their
    events, owner and listeners) from the cache's Redis; how many. Redis away: logged, and the
    events expire on their own a minute after their last one."""
    across = runtime.stack.sharing.across if runtime.stack is not None else None
    shared = isinstance(across, AcrossProcesses)  # the process's own, when it runs a model
    registry = (
        across.registry()
        if isinstance(across, AcrossProcesses)
        else GenerationRegistry(
            settings.CHAT_CACHE_REDIS_URL, lease_seconds=settings.CHAT_COALESCE_LEASE_SECONDS
        )
    )
    gone = 0
    try:
        for tag in tags:
            gone += registry.forget(tag)
    except registry.errors as exc:
        log.warning(
            "could not delete the shared generations of deleted conversations (%s: %s); their "
            "events expire by themselves",
            type(exc).__name__,
            exc,
        )
    finally:
        if not shared:
            registry.close()
    return gone
