"""`manage.py budget set|show|reconcile`: token and answer budgets for scripts (docs/using.md)."""

from __future__ import annotations

import argparse

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from chat.models import ApiKey, Budget, BudgetDefault
from chat.models.budgets import LIMITS
from chat.stores.apikeys import PREFIX_CHARS
from chat.stores.budgets import Scope, budget_set
from chat.stores.spending import spending
from chat.turns.budget import standings

UNLIMITED = ("none", "unset", "-")


def limit_value(raw: str) -> int | None:
    """A limit: a whole number from 0, or `none` (no limit of that kind)."""
    if raw.strip().lower() in UNLIMITED:
        return None
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a whole number (or `none` for no limit)"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r} is negative; a limit is 0 or more")
    return value


class Command(BaseCommand):
    help = "Set, show or reconcile the token and answer budgets of users and API keys."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        setting = actions.add_parser(
            "set", help="set some limits of a user's, a key's or the default budget"
        )
        whose = setting.add_mutually_exclusive_group(required=True)
        whose.add_argument("--user", help="the username")
        whose.add_argument(
            "--default", action="store_true", help="the budget new accounts are given"
        )
        setting.add_argument("--key", help="with --user: the prefix of one of the user's API keys")
        for name in LIMITS:
            setting.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                type=limit_value,
                default=argparse.SUPPRESS,
                metavar="N",
                help=f"{name.replace('_', ' ')} (UTC); `none` removes the limit",
            )
        setting.add_argument(
            "--clear", action="store_true", help="remove every limit of this budget"
        )
        show = actions.add_parser("show", help="budgets and what is left of them")
        show.add_argument("--user", help="only this user's")
        actions.add_parser(
            "reconcile",
            help="drop the shared counters in Redis: each is counted afresh from the database",
        )

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    def _set(self, *, user=None, default=False, key=None, clear=False, **options):
        limits = {name: options[name] for name in LIMITS if name in options}
        if clear:
            limits = dict.fromkeys(LIMITS)
        elif not limits:
            raise CommandError("nothing to set: give --daily-tokens, ... or --clear")
        if default:
            if key:
                raise CommandError("--key goes with --user, not --default")
            row = BudgetDefault.current()
            for name, value in limits.items():
                setattr(row, name, value)
            row.save()
            self.stdout.write(f"default budget for new accounts: {describe(row.limits())}")
            return
        owner = _user(user)
        api_key = _key(owner, key) if key else None
        budget = budget_set(
            user_id=owner.pk, api_key_id=api_key.pk if api_key else None, limits=limits
        )
        if not budget.limits():
            budget.delete()
        whose = f"key {api_key.prefix}… of {owner}" if api_key else str(owner)
        self.stdout.write(f"budget of {whose}: {describe(budget.limits())}")

    def _show(self, *, user=None, **_):
        budgets = Budget.objects.select_related("user", "api_key").order_by("user_id", "api_key_id")
        if user:
            budgets = budgets.filter(user=_user(user))
        default = BudgetDefault.current().limits()
        self.stdout.write(f"default for new accounts: {describe(default)}")
        for budget in budgets:
            scope = (
                Scope("key", budget.api_key_id)
                if budget.api_key_id
                else Scope("user", budget.user_id)
            )
            whose = (
                f"{budget.user} key {budget.api_key.prefix}…"
                if budget.api_key
                else str(budget.user)
            )
            rows = standings([(scope, budget.limits())])
            parts = [
                f"{one.limit_name.replace('_', ' ')} {one.spent}/{one.limit}, {one.left} left"
                for one in rows
            ]
            self.stdout.write(f"{whose}: {'; '.join(parts) or 'no limit'}")

    def _reconcile(self, **_):
        spending.clear()
        self.stdout.write("budget counters dropped; each is counted afresh from the database")


def describe(limits: dict[str, int]) -> str:
    if not limits:
        return "no limit"
    return ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in limits.items())


def _user(name: str):
    User = get_user_model()
    try:
        return User.objects.get(**{User.USERNAME_FIELD: name})
    except User.DoesNotExist:
        raise CommandError(f"no user {name!r}") from None


def _key(user, prefix: str) -> ApiKey:
    prefix = prefix.rstrip("…").strip()
    if not prefix:
        raise CommandError("--key needs the key's prefix, as `apikey list` shows it")
    keys = list(
        ApiKey.objects.filter(user=user).filter(
            Q(prefix__startswith=prefix) | Q(prefix=prefix[:PREFIX_CHARS])
        )
    )
    keys = [k for k in keys if k.prefix.startswith(prefix) or prefix.startswith(k.prefix)]
    if not keys:
        raise CommandError(f"{user} has no API key starting {prefix!r} (see `apikey list`)")
    if len(keys) > 1:
        raise CommandError(f"{len(keys)} keys of {user} start {prefix!r}; give more of it")
    return keys[0]
