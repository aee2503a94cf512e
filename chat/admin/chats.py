"""The admin of conversations and their messages; deleting a conversation here erases it as its
owner's Delete does."""

from django.contrib import admin

from ..models import Conversation, Message
from ..stores import erasure


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "finish_reason", "outcome", "text", "metrics", "created_at")
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "user", "api_key", "updated_at")
    search_fields = ("title", "messages__text")
    list_filter = ("updated_at",)
    inlines = [MessageInline]

    # As the owner's Delete does: running answers cancelled, cached answers nobody holds erased.
    def delete_model(self, request, obj):
        erasure.conversations_erase(conversations=Conversation.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        erasure.conversations_erase(conversations=queryset)


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "conversation",
        "role",
        "status",
        "finish_reason",
        "outcome",
        "policy",
        "created_at",
    )
    list_filter = ("role", "status", "finish_reason", "outcome", "policy")
    search_fields = ("text", "raw_text", "request_id")
    readonly_fields = (
        "conversation",
        # A select of every message would be the page's size; the branch is the user's choice.
        "parent",
        "selected",
        "role",
        "request_id",
        "metrics",
        "policy",
        "policy_version",
        "outcome",
        "outcome_reason",
        "json_value",
        "raw_text",
        "retries",
        "held_ms",
        "created_at",
        "updated_at",
    )
