from django.contrib import admin
from django.urls import path

from chat import api, apikey_views, openai_api, views
from chat.admin_views import latency_view

urlpatterns = [
    path("", views.index, name="index"),
    path("api/conversations/", views.conversations, name="conversations"),
    path("api/conversations/<int:conversation_id>/", views.conversation, name="conversation"),
    path("api/chat", api.chat, name="api-chat"),
    path("api/chat/stream", api.chat_stream, name="api-chat-stream"),
    path("api/chat/cancel", api.cancel, name="api-chat-cancel"),
    path("api/csrf", api.csrf, name="api-csrf"),
    path("account/api-keys/", apikey_views.api_keys, name="account-api-keys"),
    path("v1/models", openai_api.models, name="openai-models"),
    path("v1/chat/completions", openai_api.chat_completions, name="openai-chat-completions"),
    path("v1/<path:rest>", openai_api.not_found),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("admin/latency/", admin.site.admin_view(latency_view), name="admin-latency"),
    path("admin/", admin.site.urls),
]
