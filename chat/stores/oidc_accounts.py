"""The account of a user the OpenID Connect provider vouched for: made at the first sign-in,
found by (issuer, subject) afterwards, and staff or superuser as the provider's groups say at
every sign-in."""

from __future__ import annotations

import hashlib
import logging

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from ..models import OidcIdentity

log = logging.getLogger(__name__)

USERNAME_MAX = 150  # Django's User.username


def account_for(claims: dict, *, issuer: str, mapping: dict) -> object:
    """The account of the provider's user `claims["sub"]`, made if this is their first sign-in,
    with its e-mail address and (when a groups claim is configured) its staff and superuser
    flags brought in line with the claims. `mapping` is settings.CHAT_OIDC."""
    subject = str(claims["sub"])
    with transaction.atomic():
        identity = (
            OidcIdentity.objects.select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        if identity is None:
            try:
                with transaction.atomic():
                    identity = _account_make(claims, issuer=issuer, subject=subject)
            except IntegrityError:  # the same user's first sign-in in two tabs at once
                identity = OidcIdentity.objects.select_related("user").get(
                    issuer=issuer, subject=subject
                )
        user = identity.user
        changed = _claims_apply(user, claims, mapping)
        if changed:
            user.save(update_fields=changed)
        if mapping.get("groups_claim"):
            _engine_groups_apply(user, groups_of(claims, mapping["groups_claim"]))
        identity.save(update_fields=["last_sign_in_at"])
    return user


def _account_make(claims: dict, *, issuer: str, subject: str) -> OidcIdentity:
    User = get_user_model()
    user = User.objects.create_user(username=_username_free(claims, issuer, subject))
    user.set_unusable_password()  # only the provider signs this account in
    user.save(update_fields=["password"])
    log.info("OIDC: account %s made for %s at %s", user.get_username(), subject, issuer)
    return OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)


def _username_free(claims: dict, issuer: str, subject: str) -> str:
    """The provider's preferred_username (else the e-mail address, else the subject); if a local
    account already has it, with a suffix of the identity's own, so the two never merge."""
    wanted = (
        str(claims.get("preferred_username") or claims.get("email") or subject).strip() or subject
    )
    wanted = wanted[:USERNAME_MAX]
    User = get_user_model()
    if not User.objects.filter(username__iexact=wanted).exists():
        return wanted
    suffix = hashlib.sha256(f"{issuer} {subject}".encode()).hexdigest()[:8]
    return f"{wanted[: USERNAME_MAX - 9]}-{suffix}"


def groups_of(claims: dict, claim: str) -> set[str]:
    """The group names in `claims[claim]`, a list or one string; Keycloak's full group paths
    (`/chat-staff`) count as the group's name."""
    value = claims.get(claim) or []
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return {str(name).strip().lstrip("/") for name in names if str(name).strip()}


def _engine_groups_apply(user, groups: set[str]) -> None:
    """The user's membership of the groups engines are kept for (models/engines.py) as the
    provider's groups say; other groups are the admin's and left alone."""
    engine_groups = Group.objects.filter(engine__isnull=False).distinct()
    user.groups.remove(*[g for g in engine_groups if g.name not in groups])
    user.groups.add(*[g for g in engine_groups if g.name in groups])


def _claims_apply(user, claims: dict, mapping: dict) -> list[str]:
    """Set what the provider decides; returns the fields changed. Without a groups claim in the
    configuration the flags are left alone (staff may then be granted in the admin)."""
    wanted: dict[str, object] = {}
    email = claims.get("email")
    if isinstance(email, str) and email:
        wanted["email"] = email
    if mapping.get("groups_claim"):
        groups = groups_of(claims, mapping["groups_claim"])
        superuser = bool(groups & mapping["superuser_groups"])
        wanted["is_superuser"] = superuser
        wanted["is_staff"] = superuser or bool(groups & mapping["staff_groups"])
    changed = [field for field, value in wanted.items() if getattr(user, field) != value]
    for field in changed:
        setattr(user, field, wanted[field])
    return changed
