"""The settings page a signed-in user owns (/settings/): custom instructions and the policy new
chats start with, the account's e-mail address and password, and the way to API keys, the
export and the account's deletion. A visitor is told to sign in to keep settings."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model, update_session_auth_hash
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods

from ..accounts.forms import ChatSettingsForm, EmailChangeForm, PasswordChangeKeepingForm
from ..stores.user_settings import settings_of

SAVED = {
    "chat": "Chat settings saved; they apply from your next message.",
    "email": "E-mail address saved.",
    "password": "Password changed.",
}


@sensitive_post_parameters()
@never_cache
@require_http_methods(["GET", "POST"])
def settings_page(request):
    """GET shows every section; POST saves the one its `section` names, then comes back here
    (or shows that section again with its errors by the fields, nothing else changed)."""
    if not request.user.is_authenticated:
        return render(
            request,
            "accounts/settings_visitor.html",
            {"signup_open": settings.CHAT_LOCAL_ACCOUNTS and settings.CHAT_SIGNUP != "closed"},
            status=403 if request.method == "POST" else 200,
        )
    user = request.user
    section = request.POST.get("section") if request.method == "POST" else None
    forms = section_forms(request, section)
    status = 200
    if section is not None:
        form = forms.get(section)
        if form is None:
            return render_page(request, forms, "That part of the settings cannot be changed.", 400)
        if form.is_valid():
            form.save()
            if section == "password":
                update_session_auth_hash(request, user)  # this browser stays signed in
            return redirect(f"{reverse('settings')}?saved={section}")
        status = 400
    return render_page(request, forms, "", status)


def section_forms(request, section: str | None) -> dict:
    """Each section's form, bound to the POST only for the section it saves."""
    user = request.user

    def data(name: str):
        return request.POST if section == name else None

    forms = {
        "chat": ChatSettingsForm(data("chat"), instance=settings_of(user), prefix="chat"),
    }
    if user.has_usable_password():  # a provider's account: the provider holds its address
        # A copy of the user: a refused address must not show as the account's on this page.
        account = get_user_model().objects.get(pk=user.pk)
        forms["email"] = EmailChangeForm(
            data("email"), instance=account, request=request, prefix="email"
        )
        if settings.CHAT_LOCAL_ACCOUNTS:
            forms["password"] = PasswordChangeKeepingForm(user, data("password"), prefix="password")
    for form in forms.values():
        if not form.is_bound:  # the page opens at its top, not scrolled to the password form
            for field in form.fields.values():
                field.widget.attrs.pop("autofocus", None)
    return forms


def render_page(request, forms: dict, error: str, status: int):
    return render(
        request,
        "accounts/settings.html",
        {
            "chat_form": forms["chat"],
            "email_form": forms.get("email"),
            "password_form": forms.get("password"),
            "saved": SAVED.get(request.GET.get("saved", "")),
            "error": error,
        },
        status=status,
    )
