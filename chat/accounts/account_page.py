"""The signed-in user's own data: export everything the account holds, and delete the account
(the password asked again, counted like a sign-in). The deletion itself is chat/stores/erasure.py."""

from __future__ import annotations

from django import forms
from django.contrib import auth
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_GET, require_http_methods

from ..models import Conversation
from ..protocol import error_fields
from ..stores.apikeys import keys_of
from ..stores.conversations import export_all_json, export_all_markdown
from ..stores.erasure import account_erase
from .forms import current_password_check

EXPORTS = {
    "json": (export_all_json, "application/json", "json"),
    "markdown": (export_all_markdown, "text/markdown; charset=utf-8", "md"),
}


@never_cache
@login_required
@require_GET
def account_export(request):
    """Everything the account holds in one file (`?format=json|markdown`), e.g. before deleting it."""
    kind = request.GET.get("format", "json")
    if kind not in EXPORTS:
        return JsonResponse(
            error_fields("bad_format", "format must be json or markdown"), status=400
        )
    export, content_type, extension = EXPORTS[kind]
    response = HttpResponse(export(user=request.user), content_type=content_type)
    name = f"account-{request.user.get_username()}.{extension}"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


class AccountDeleteForm(forms.Form):
    """The password again: a session left open on someone else's screen cannot delete the account."""

    password = forms.CharField(
        label="Your password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password", "autofocus": True}),
    )

    def __init__(self, *args, user, request, **kwargs):
        super().__init__(*args, **kwargs)
        self.user, self.request = user, request
        if not user.has_usable_password():
            # An account the OpenID Connect provider signs in has no password here: its user
            # name typed out instead, so a stray click cannot delete it.
            self.fields["password"] = forms.CharField(
                label="Type your user name to confirm",
                widget=forms.TextInput(attrs={"autocomplete": "off", "autofocus": True}),
            )

    def clean_password(self):
        if not self.user.has_usable_password():
            typed = self.cleaned_data["password"]
            if typed != self.user.get_username():
                raise forms.ValidationError("That is not your user name.", code="name_incorrect")
            return typed
        password = self.cleaned_data["password"]
        current_password_check(self.user, self.request, password)
        return password


@sensitive_post_parameters("password")
@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def account_delete(request):
    """GET says what goes and offers the export; POST with the right password deletes it all."""
    user = request.user
    form = AccountDeleteForm(request.POST or None, user=user, request=request)
    if request.method == "POST" and form.is_valid():
        account_erase(user=user)
        auth.logout(request)  # this browser's session, whose row is already gone
        return redirect("account-deleted")
    context = {
        "form": form,
        "conversations": Conversation.objects.filter(user=user).count(),
        "keys": keys_of(user).count(),
    }
    return render(
        request, "accounts/account_delete.html", context, status=400 if form.errors else 200
    )


@require_GET
def account_deleted(request):
    return render(request, "accounts/account_deleted.html")
