"""`manage.py apikey create|revoke|list`: API keys for scripts and deployments."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from chat.models import ApiKey
from chat.stores.apikeys import apikey_create, apikey_revoke


class Command(BaseCommand):
    help = "Create, revoke or list the OpenAI-compatible API's keys."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="print a new key alone on the last line")
        create.add_argument("--user", required=True, help="the username the key acts as")
        create.add_argument("--name", default="", help="a label, e.g. what the key is for")
        revoke = actions.add_parser("revoke", help="revoke a key by id (see `apikey list`)")
        revoke.add_argument("key_id", type=int)
        listing = actions.add_parser("list", help="every key: id, user, name, prefix, state")
        listing.add_argument("--user", help="only this user's keys")

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    def _create(self, *, user, name, **_):
        User = get_user_model()
        try:
            owner = User.objects.get(**{User.USERNAME_FIELD: user})
        except User.DoesNotExist:
            raise CommandError(f"no user {user!r}") from None
        row, key = apikey_create(user=owner, name=name)
        self.stdout.write(f"created key {row.pk} ({row.prefix}…) for {user}; it is shown once:")
        self.stdout.write(key)

    def _revoke(self, *, key_id, **_):
        if not apikey_revoke(key_id=key_id):
            raise CommandError(f"no active key {key_id}")
        self.stdout.write(f"revoked key {key_id}")

    def _list(self, *, user=None, **_):
        keys = ApiKey.objects.select_related("user").order_by("id")
        if user:
            keys = keys.filter(**{f"user__{get_user_model().USERNAME_FIELD}": user})
        for key in keys:
            if not key.is_active:
                state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}"
            elif key.is_expired:
                state = f"expired {key.expires_at:%Y-%m-%d %H:%M}"
            else:
                state = "active"
            used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
            self.stdout.write(
                f"{key.pk}\t{key.user}\t{key.name or '-'}\t{key.prefix}…\t{state}\tlast used {used}"
            )
