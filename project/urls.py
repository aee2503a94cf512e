from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from chat.transports import (
    account_views,
    accounts,
    api,
    apikey_views,
    openai_api,
    usage_views,
    views,
)
from chat.transports.admin_views import behaviour_view, latency_view

# The product's own error pages; JSON in the API's shape on /api/ and /v1/
# (chat/transports/error_pages.py).
handler400 = "chat.transports.error_pages.bad_request"
handler403 = "chat.transports.error_pages.permission_denied"
handler404 = "chat.transports.error_pages.page_not_found"
handler500 = "chat.transports.error_pages.server_error"

# Django's own auth views, with the chat's look (the admin keeps its own templates).
ACCOUNTS = "accounts/"

urlpatterns = [
    path("", views.index, name="index"),
    path("accounts/login/", accounts.SignInView.as_view(), name="login"),
    path("accounts/signup/", accounts.sign_up, name="signup"),
    path("accounts/confirm/<uidb64>/<token>/", accounts.sign_up_confirm, name="signup-confirm"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "accounts/password_change/",
        auth_views.PasswordChangeView.as_view(template_name=f"{ACCOUNTS}password_change_form.html"),
        name="password_change",
    ),
    path(
        "accounts/password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(
            template_name=f"{ACCOUNTS}password_change_done.html"
        ),
        name="password_change_done",
    ),
    path(
        "accounts/password_reset/",
        auth_views.PasswordResetView.as_view(template_name=f"{ACCOUNTS}password_reset_form.html"),
        name="password_reset",
    ),
    path(
        "accounts/password_reset/done/",
        auth_views.PasswordResetDoneView.as_view(
            template_name=f"{ACCOUNTS}password_reset_done.html"
        ),
        name="password_reset_done",
    ),
    path(
        "accounts/reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(
            template_name=f"{ACCOUNTS}password_reset_confirm.html"
        ),
        name="password_reset_confirm",
    ),
    path(
        "accounts/reset/done/",
        auth_views.PasswordResetCompleteView.as_view(
            template_name=f"{ACCOUNTS}password_reset_complete.html"
        ),
        name="password_reset_complete",
    ),
    path("api/conversations/", views.conversations, name="conversations"),
    path("api/conversations/<int:conversation_id>/", views.conversation, name="conversation"),
    path(
        "api/conversations/<int:conversation_id>/export",
        views.conversation_export,
        name="conversation-export",
    ),
    path("api/chat", api.chat, name="api-chat"),
    path("api/chat/stream", api.chat_stream, name="api-chat-stream"),
    path("api/chat/cancel", api.cancel, name="api-chat-cancel"),
    path("api/csrf", api.csrf, name="api-csrf"),
    path("account/api-keys/", apikey_views.api_keys, name="account-api-keys"),
    path("account/usage/", usage_views.usage, name="account-usage"),
    path("account/export", account_views.account_export, name="account-export"),
    path("account/delete/", account_views.account_delete, name="account-delete"),
    path("account/deleted/", account_views.account_deleted, name="account-deleted"),
    path("v1/models", openai_api.models, name="openai-models"),
    path("v1/chat/completions", openai_api.chat_completions, name="openai-chat-completions"),
    path("v1/<path:rest>", openai_api.not_found),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("admin/latency/", admin.site.admin_view(latency_view), name="admin-latency"),
    path("admin/behaviour/", admin.site.admin_view(behaviour_view), name="admin-behaviour"),
    path(
        "admin/usage/",
        admin.site.admin_view(usage_views.admin_usage_view),
        name="admin-usage",
    ),
    path("admin/", admin.site.urls),
]
