"""Whether someone may still act as the account they once proved to be: checked again at every
use of an API key (chat/stores/apikeys.py) and at every frame of a signed-in socket that acts on
answers (chat/turns/signed_in.py), so a person removed here or at the identity provider loses
every way in, not only the next sign-in.

Each check answers None (still allowed) or a sentence saying why not, written for the holder of
that key or socket: it names their own account's state and nothing of anyone else's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from importlib import import_module

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import HASH_SESSION_KEY, get_user_model
from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone
from django.utils.crypto import constant_time_compare


def _provider() -> str:
    return settings.CHAT_OIDC["name"] if settings.CHAT_OIDC else "the identity provider"


def sign_in_refusal(user, now: datetime | None = None) -> str | None:
    """Why `user` could not sign in now, or None if they could. Reads `user.oidc_identity`
    (select it with the user to save a query)."""
    if not user.is_active:
        return "its account is deactivated"
    try:
        identity = user.oidc_identity
    except ObjectDoesNotExist:
        identity = None
    if identity is None:
        if not settings.CHAT_LOCAL_ACCOUNTS:
            return (
                f"its account has a password only, and accounts here sign in through {_provider()}"
            )
        return None
    idle = settings.CHAT_OIDC_KEY_IDLE_DAYS
    if idle and (now or timezone.now()) - identity.last_sign_in_at > timedelta(days=idle):
        return (
            f"its account has not signed in through {_provider()} for over {idle} days; "
            "sign in there again to use it"
        )
    return None


def user_refusal(user_id: int) -> str | None:
    """`sign_in_refusal` of the account `user_id` (a deleted one is refused)."""
    user = get_user_model().objects.select_related("oidc_identity").filter(pk=user_id).first()
    return "its account was deleted" if user is None else sign_in_refusal(user)


def session_auth_hash(session) -> str:
    """The password-derived hash Django keeps in a signed-in session (empty if none)."""
    return session.get(HASH_SESSION_KEY, "")


def session_refusal(*, user_id: int, session_key: str, auth_hash: str) -> str | None:
    """Why session `session_key`, signed in as `user_id` with `auth_hash` when its socket
    opened, no longer speaks for that user; None while it does.

    What Django's `get_user` checks at every page request, read afresh: the session still
    holds that user through a sign-in backend still configured (CHAT_LOCAL_ACCOUNTS=0 drops
    the password one), the backend still lets them in (active), and their password is the one
    the socket opened with; a password changed in this very session, which keeps that session
    valid, ends the socket all the same. Unlike `get_user` it never flushes the session: a
    check racing a password change must not sign that browser out."""
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is not None and not user.is_active:
        return "your account is deactivated"
    if user is not None and not constant_time_compare(user.get_session_auth_hash(), auth_hash):
        return "your password was changed; sign in again"
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key).load()
    backend = data.get(auth.BACKEND_SESSION_KEY)
    if (
        user is None
        or str(data.get(auth.SESSION_KEY)) != str(user_id)
        or backend not in settings.AUTHENTICATION_BACKENDS
        or auth.load_backend(backend).get_user(user_id) is None
    ):
        return "you are signed out; sign in again"
    return None
