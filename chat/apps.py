from django.apps import AppConfig
from django.conf import settings
from django.contrib.auth.signals import user_logged_out
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db.models.signals import post_delete, post_migrate, post_save

HOOK_SETTINGS = ("CHAT_HOOK_HOSTS", "CHAT_HOOK_SECRETS")


def hook_reach_apply(**kwargs) -> None:
    """Hands the hosts and secrets the operator allows hooks to chat/policy/reach.py (at start
    and whenever a test changes them): chat/policy reads no settings itself."""
    if kwargs.get("setting", HOOK_SETTINGS[0]) not in HOOK_SETTINGS:
        return
    from .policy import reach

    try:
        reach.allow(hosts=settings.CHAT_HOOK_HOSTS, secrets=settings.CHAT_HOOK_SECRETS)
    except ValueError as exc:
        raise ImproperlyConfigured(f"CHAT_HOOKS: hosts: {exc}") from None


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self):
        # checks registers the system checks; erasure and evictions their post_delete receivers;
        # audit its receiver that fills in every audit record's actor and event.
        from .infra import audit, checks  # noqa: F401
        from .stores import erasure, evictions  # noqa: F401
        from .stores.budgets import budget_default_apply
        from .stores.recovery import on_post_migrate
        from .turns.running import on_account_saved, on_signed_out

        hook_reach_apply()
        setting_changed.connect(hook_reach_apply, dispatch_uid="chat-hook-reach")
        # Start-up migrates before serving: answers a previous process left streaming are closed then.
        post_migrate.connect(on_post_migrate, sender=self, dispatch_uid="chat-interrupted-answers")
        # A sign-out, and an account saved or deleted, end the sockets that no longer speak for
        # it, in every process (chat/turns/signed_in.py).
        user_logged_out.connect(on_signed_out, dispatch_uid="chat-signed-out-sockets")
        user = settings.AUTH_USER_MODEL
        post_save.connect(on_account_saved, sender=user, dispatch_uid="chat-account-saved")
        post_delete.connect(on_account_saved, sender=user, dispatch_uid="chat-account-deleted")
        # A new account gets the default budget (chat/stores/budgets.py).
        post_save.connect(
            budget_default_apply,
            sender=settings.AUTH_USER_MODEL,
            dispatch_uid="chat-default-budget",
        )
