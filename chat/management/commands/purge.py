"""`manage.py purge`: delete what is past its time; for cron or a systemd timer (docs/privacy.md)."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chat.stores.erasure import retention_purge


class Command(BaseCommand):
    help = (
        "Delete conversations idle longer than CHAT_RETENTION_DAYS and visitors' conversations "
        "whose session ended (clearing expired sessions), erase the cached answers no "
        "conversation holds any more, delete audit-trail records older than "
        "CHAT_AUDIT_RETENTION_DAYS, and retry cache evictions Redis could not take. Safe to "
        "repeat or overlap. Exits 1 while evictions stay pending (Redis unreachable)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="retention in days instead of CHAT_RETENTION_DAYS (0 keeps every conversation)",
        )

    def handle(self, *args, days=None, **options):
        days = settings.CHAT_RETENTION_DAYS if days is None else days
        if days < 0:
            raise CommandError("--days must be 0 (keep) or a number of days")
        report = retention_purge(days=days, audit_days=settings.CHAT_AUDIT_RETENTION_DAYS)
        expired = (
            f"{report.expired} conversation(s) idle over {days} days"
            if days
            else "retention off (CHAT_RETENTION_DAYS unset)"
        )
        audit_days = settings.CHAT_AUDIT_RETENTION_DAYS
        audit = (
            f"{report.audit_expired} audit record(s) over {audit_days} days old deleted"
            if audit_days
            else "audit trail kept (CHAT_AUDIT_RETENTION_DAYS=0)"
        )
        if options["verbosity"] >= 1:  # -v 0 for cron: only a failure says anything
            self.stdout.write(
                f"purge: {expired}, {report.visitors} of visitors whose session ended; cached answers "
                f"{report.answers_before} -> {report.answers_after} "
                f"({report.redacted} approved kept with the prompt redacted); "
                f"{report.evictions_pending} cache eviction(s) pending; {audit}"
            )
        if report.evictions_pending:
            raise CommandError(
                f"{report.evictions_pending} cache eviction(s) are pending: Redis is unreachable. "
                "The next run retries them, and so does the server at its next cache write."
            )
