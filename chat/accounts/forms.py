"""The account forms the sign-up and settings pages share: an e-mail address unique whatever
its case, the current password asked again (counted like a sign-in), and password pairs that
keep what was typed right when only the confirmation was wrong."""

from __future__ import annotations

import math

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import PasswordChangeForm, UserCreationForm

from ..infra import signin_throttle
from ..models import ChatSettings, OutputPolicy
from ..models.user_settings import MAX_INSTRUCTIONS_CHARS
from ..stores.engine_routes import visible_policies


def email_in_use(email: str, *, other_than=None) -> bool:
    """Whether an account other than `other_than` has `email`, in any case: a password reset
    goes to every account with that address, so one address names one account."""
    accounts = get_user_model().objects.filter(email__iexact=email)
    if other_than is not None:
        accounts = accounts.exclude(pk=other_than.pk)
    return accounts.exists()


class UniqueEmailMixin:
    """clean_email: an address no other account has (the form's `instance` may keep its own)."""

    def clean_email(self):
        email = self.cleaned_data["email"].strip()
        owner = getattr(self, "instance", None)
        if email and email_in_use(email, other_than=owner if owner and owner.pk else None):
            raise forms.ValidationError(
                "Another account already uses this e-mail address.", code="email_in_use"
            )
        return email


def current_password_check(user, request, password: str) -> None:
    """ValidationError unless `password` is `user`'s; the sign-in limits apply, as a check of a
    password is a sign-in's."""
    username = user.get_username()
    address = signin_throttle.client_address(request)
    wait = signin_throttle.wait_seconds(username, address)
    if wait:
        minutes = math.ceil(wait / 60)
        raise forms.ValidationError(
            "Too many failed sign-in attempts; try again in %(n)d minute%(s)s.",
            code="throttled",
            params={"n": minutes, "s": "" if minutes == 1 else "s"},
        )
    if not user.check_password(password):
        signin_throttle.record_failure(username, address)
        raise forms.ValidationError("That is not your password.", code="password_incorrect")
    signin_throttle.record_success(username)


class KeepPasswordOnMismatch:
    """When only the confirmation differs, the form comes back with the other passwords kept,
    the confirmation empty and focused, its error beside it: Django's password inputs otherwise
    come back empty, all of them, and the user types everything again."""

    confirm_field = "password2"
    kept_fields: tuple[str, ...] = ("password1",)

    def full_clean(self):
        super().full_clean()  # type: ignore[misc]
        form: forms.BaseForm = self  # type: ignore[assignment]
        if not form.has_error(self.confirm_field, "password_mismatch"):
            return
        for name in self.kept_fields:
            if not form.has_error(name):
                form.fields[name].widget.render_value = True  # type: ignore[attr-defined]
        for field in form.fields.values():
            field.widget.attrs.pop("autofocus", None)
        form.fields[self.confirm_field].widget.attrs["autofocus"] = True


class SignUpForm(KeepPasswordOnMismatch, UniqueEmailMixin, UserCreationForm):
    """Sign-up: a user name, an e-mail address (optional; without one a forgotten password
    cannot be reset), the password twice."""

    email = forms.EmailField(
        required=False,
        help_text="Optional. Where a password reset link can reach you; no other account may "
        "use it.",
    )

    class Meta(UserCreationForm.Meta):
        fields = ("username", "email")


class ConfirmedSignUpForm(SignUpForm):
    """Sign-up with CHAT_SIGNUP=confirm: the e-mail address is required, the confirmation link
    goes there."""

    email = forms.EmailField(help_text="The link that opens your account is sent here.")


class PasswordChangeKeepingForm(KeepPasswordOnMismatch, PasswordChangeForm):
    """Django's password change, keeping the old and the new password on a mismatch."""

    confirm_field = "new_password2"
    kept_fields = ("old_password", "new_password1")


class EmailChangeForm(UniqueEmailMixin, forms.ModelForm):
    """The account's e-mail address, changed with the password given again: the address is
    where a password reset goes, so a session left open must not be able to redirect it."""

    email = forms.EmailField(
        required=False,
        label="E-mail address",
        help_text="Where a password reset link can reach you. Empty: no reset by mail.",
        widget=forms.EmailInput(attrs={"autocomplete": "email"}),
    )
    password = forms.CharField(
        label="Your password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}),
    )

    class Meta:
        model = get_user_model()
        fields = ("email",)

    def __init__(self, *args, request, **kwargs):
        super().__init__(*args, **kwargs)
        self.request = request

    def clean_password(self):
        password = self.cleaned_data["password"]
        current_password_check(self.instance, self.request, password)
        return password


class ChatSettingsForm(forms.ModelForm):
    """Custom instructions and the policy new chats start with."""

    instructions = forms.CharField(
        label="Custom instructions",
        required=False,
        max_length=MAX_INSTRUCTIONS_CHARS,
        widget=forms.Textarea(attrs={"rows": 5}),
        help_text=f"Read by the model before every new message in your chats (at most "
        f"{MAX_INSTRUCTIONS_CHARS} characters), e.g. how you like answers written. Not used "
        "by API keys' /v1 requests, which bring their own system prompt.",
        error_messages={
            "max_length": "Custom instructions can be at most %(limit_value)d characters; "
            "these are %(show_value)d. Shorten them and save again: nothing was saved."
        },
    )

    class Meta:
        model = ChatSettings
        fields = ("instructions", "default_policy")
        labels = {"default_policy": "New chats start with"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields["default_policy"]
        field.queryset = visible_policies(  # type: ignore[attr-defined]
            self.instance.user_id if self.instance else None
        ).order_by("name")
        site_default = OutputPolicy.objects.filter(is_default=True).first()
        field.empty_label = (  # type: ignore[attr-defined]
            f"The site's default ({site_default.name})" if site_default else "The site's default"
        )
        field.help_text = "The output policy the chat page picks for a new chat."
