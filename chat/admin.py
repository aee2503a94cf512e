from django.contrib import admin

from .models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "finish_reason", "text", "metrics", "created_at")
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
    list_display = ("id", "conversation", "role", "status", "finish_reason", "created_at")
    list_filter = ("role", "status", "finish_reason")
    search_fields = ("text", "request_id")
    readonly_fields = ("conversation", "role", "request_id", "metrics", "created_at", "updated_at")
