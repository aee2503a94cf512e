from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.decorators.cache import never_cache

from chat.accounts import account_page, api_keys_page, forms, oidc_views, sign_in
from chat.admin.report_pages import behaviour_view, latency_view
from chat.admin.usage_page import admin_usage_view
from chat.health import views as health
from chat.pages import chat_page, settings_page, usage_page
from chat.transports import api, feedback_api
from chat.transports.openai import views as openai

# The product's own error pages; JSON in the API's shape on /api/ and /v1/
# (chat/pages/error_pages.py).
handler400 = "chat.pages.error_pages.bad_request"
handler403 = "chat.pages.error_pages.permission_denied"
handler404 = "chat.pages.error_pages.page_not_found"
handler500 = "chat.pages.error_pages.server_error"


def password_view(view_class, template: str, **options):
    """Django's own password view with the chat's look (the admin keeps its own templates),
    refused with CHAT_LOCAL_ACCOUNTS=0."""
    return sign_in.local_accounts_only(
        view_class.as_view(template_name=f"accounts/{template}.html", **options)
    )


urlpatterns = [
    path("", chat_page.index, name="index"),
    path("accounts/login/", sign_in.SignInView.as_view(), name="login"),
    path("accounts/signup/", sign_in.sign_up, name="signup"),
    path("accounts/confirm/<uidb64>/<token>/", sign_in.sign_up_confirm, name="signup-confirm"),
    path("accounts/logout/", oidc_views.SignOutView.as_view(), name="logout"),
    # Sign-in with the OpenID Connect provider (CHAT_OIDC; 404 without): the library reverses
    # these two names. The callback is the redirect URI registered at the provider.
    path(
        "accounts/oidc/start/",
        oidc_views.OidcSignInStart.as_view(),
        name="oidc_authentication_init",
    ),
    path(
        "accounts/oidc/callback/",
        oidc_views.OidcCallback.as_view(),
        name="oidc_authentication_callback",
    ),
    path(
        "accounts/password_change/",
        # never_cache: a mismatch's answer holds the passwords typed (chat/accounts/forms.py).
        never_cache(
            password_view(
                auth_views.PasswordChangeView,
                "password_change_form",
                form_class=forms.PasswordChangeKeepingForm,
            )
        ),
        name="password_change",
    ),
    path(
        "accounts/password_change/done/",
        password_view(auth_views.PasswordChangeDoneView, "password_change_done"),
        name="password_change_done",
    ),
    path(
        "accounts/password_reset/",
        password_view(auth_views.PasswordResetView, "password_reset_form"),
        name="password_reset",
    ),
    path(
        "accounts/password_reset/done/",
        password_view(auth_views.PasswordResetDoneView, "password_reset_done"),
        name="password_reset_done",
    ),
    path(
        "accounts/reset/<uidb64>/<token>/",
        password_view(auth_views.PasswordResetConfirmView, "password_reset_confirm"),
        name="password_reset_confirm",
    ),
    path(
        "accounts/reset/done/",
        password_view(auth_views.PasswordResetCompleteView, "password_reset_complete"),
        name="password_reset_complete",
    ),
    path("api/conversations/", chat_page.conversations, name="conversations"),
    path("api/conversations/<int:conversation_id>/", chat_page.conversation, name="conversation"),
    path(
        "api/conversations/<int:conversation_id>/branch",
        chat_page.conversation_branch,
        name="conversation-branch",
    ),
    path(
        "api/conversations/<int:conversation_id>/export",
        chat_page.conversation_export,
        name="conversation-export",
    ),
    path(
        "api/messages/<int:message_id>/feedback",
        feedback_api.message_feedback,
        name="message-feedback",
    ),
    path("api/chat", api.chat, name="api-chat"),
    path("api/chat/stream", api.chat_stream, name="api-chat-stream"),
    path("api/chat/cancel", api.cancel, name="api-chat-cancel"),
    path("api/csrf", api.csrf, name="api-csrf"),
    path("settings/", settings_page.settings_page, name="settings"),
    path("account/api-keys/", api_keys_page.api_keys, name="account-api-keys"),
    path("account/usage/", usage_page.usage, name="account-usage"),
    path("account/export", account_page.account_export, name="account-export"),
    path("account/delete/", account_page.account_delete, name="account-delete"),
    path("account/deleted/", account_page.account_deleted, name="account-deleted"),
    path("v1/models", openai.models, name="openai-models"),
    path("v1/chat/completions", openai.chat_completions, name="openai-chat-completions"),
    path("v1/<path:rest>", openai.not_found),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", health.metrics, name="metrics"),
    path("admin/latency/", admin.site.admin_view(latency_view), name="admin-latency"),
    path("admin/behaviour/", admin.site.admin_view(behaviour_view), name="admin-behaviour"),
    path("admin/login/", sign_in.admin_sign_in),  # before admin's own, which it wraps
    path(
        "admin/usage/",
        admin.site.admin_view(admin_usage_view),
        name="admin-usage",
    ),
    path("admin/", admin.site.urls),
]
