from django.contrib import admin

from .models import Conversation, Message, OutputPolicy, PolicyRevision


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "finish_reason", "outcome", "text", "metrics", "created_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "user", "updated_at")
    search_fields = ("title", "messages__text")
    list_filter = ("updated_at",)
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "conversation", "role", "status", "finish_reason", "outcome", "policy", "created_at")
    list_filter = ("role", "status", "finish_reason", "outcome", "policy")
    search_fields = ("text", "raw_text", "request_id")
    readonly_fields = (
        "conversation", "role", "request_id", "metrics", "policy", "policy_version", "outcome",
        "outcome_reason", "json_value", "raw_text", "retries", "held_ms", "created_at", "updated_at",
    )


class PolicyRevisionInline(admin.TabularInline):
    model = PolicyRevision
    extra = 0
    fields = ("version", "changed_at", "changed_by", "changes")
    readonly_fields = fields
    can_delete = False
    verbose_name_plural = "history (who changed what, when)"

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(OutputPolicy)
class OutputPolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "mode", "is_default", "version", "cache_enabled", "updated_at")
    list_filter = ("mode", "is_default", "cache_enabled")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("version", "updated_at")
    inlines = [PolicyRevisionInline]
    fieldsets = (
        (None, {"fields": ("name", "slug", "is_default", "mode", "version", "updated_at")}),
        ("Checks before anyone sees the answer", {
            "fields": ("json_schema", "constrained", "moderation_hooks", "blocklist_terms", "failure_action", "fallback_text", "max_retries"),
        }),
        ("Generation", {
            "fields": ("system_prompt", "examples", "max_new_tokens", "stop_strings", "extra_eos_tokens", "temperature", "top_p"),
        }),
        ("Cache", {"fields": ("cache_enabled", "cache_ttl_seconds")}),
    )

    def save_model(self, request, obj, form, change):
        before = OutputPolicy.objects.get(pk=obj.pk).snapshot() if change else {}
        super().save_model(request, obj, form, change)
        after = obj.snapshot()
        changes = {name: [before.get(name), value] for name, value in after.items() if before.get(name) != value}
        if changes:
            PolicyRevision.objects.create(
                policy=obj, version=obj.version, changed_by=request.user, changes=changes, snapshot=after
            )
