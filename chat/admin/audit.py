"""The audit trail in the admin: read only, for everyone (superusers included), filterable by
actor, action and day. Replaces auditlog's own admin, whose delete permission is Django's."""

from auditlog.admin import LogEntryAdmin
from auditlog.filters import ResourceTypeFilter
from auditlog.models import LogEntry
from auditlog.registry import auditlog
from django.contrib import admin

from ..infra.audit import ACTIONS, EXPLICIT_EVENTS, erased_user, event_label
from .read_only import ReadOnly

admin.site.unregister(LogEntry)


class EventFilter(admin.SimpleListFilter):
    """What was done: each tracked model's created, changed, deleted, and the explicit events."""

    title = "action"
    parameter_name = "event"

    def lookups(self, request, model_admin):
        tracked = [
            (f"{model._meta.model_name}.{action}", f"{model._meta.verbose_name} {word}")
            for model in sorted(auditlog.get_models(), key=lambda m: m._meta.verbose_name)
            for action, word in (
                value for key, value in ACTIONS.items() if key != LogEntry.Action.ACCESS
            )
        ]
        return [*tracked, *EXPLICIT_EVENTS.items()]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(additional_data__event=self.value())
        return queryset


@admin.register(LogEntry)
class AuditTrailAdmin(ReadOnly, LogEntryAdmin):
    """The trail, read only; retention deletes its records (manage.py purge)."""

    list_display = ["created", "what", "resource_url", "msg_short", "who", "remote_addr"]
    list_filter = [
        EventFilter,
        ("actor", admin.RelatedOnlyFieldListFilter),
        ("timestamp", admin.DateFieldListFilter),
        ResourceTypeFilter,
    ]
    date_hierarchy = "timestamp"  # year -> month -> day
    readonly_fields = ["created", "what", "who", "resource_url", "remote_addr", "msg", "details"]
    fieldsets = [
        (None, {"fields": ["created", "what", "who", "remote_addr", "resource_url"]}),
        ("Before and after", {"fields": ["msg", "details"]}),
    ]

    @admin.display(description="action")
    def what(self, obj):
        return event_label(obj)

    @admin.display(description="who", ordering="actor")
    def who(self, obj):
        if obj.actor is not None:
            return self.user_url(obj)
        actor_id = (obj.additional_data or {}).get("actor_id")
        return erased_user(actor_id) if actor_id else "nobody signed in, or the system"

    @admin.display(description="details")
    def details(self, obj):
        data = {
            k: v for k, v in (obj.additional_data or {}).items() if k not in ("event", "actor_id")
        }
        return ", ".join(f"{key}: {value}" for key, value in data.items()) or "-"
