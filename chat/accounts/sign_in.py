"""Sign up and sign in with Django's auth forms; a visitor's conversations follow them in.

Everything else (password change and reset) is Django's own views, routed in project/urls.py,
with the templates in templates/accounts/; sign-in with the OpenID Connect provider and sign-out
are oidc_views.py. With CHAT_LOCAL_ACCOUNTS=0 every password view here refuses.
"""

from __future__ import annotations

import functools
import math

from django.conf import settings
from django.contrib import admin, auth
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.tokens import default_token_generator
from django.contrib.auth.views import LoginView
from django.core.exceptions import PermissionDenied
from django.core.mail import send_mail
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlencode, urlsafe_base64_decode, urlsafe_base64_encode
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.debug import sensitive_post_parameters

from ..infra.signin_throttle import ThrottledSignInMixin
from ..infra.signup_throttle import signup_count, signup_wait
from ..models import Conversation
from ..protocol.inputs import id_parse
from .forms import ConfirmedSignUpForm, SignUpForm


class SignInForm(ThrottledSignInMixin, AuthenticationForm):
    pass


class AdminSignInForm(ThrottledSignInMixin, AdminAuthenticationForm):
    pass


def adopt_conversations(*, session_key: str | None, user) -> int:
    """Move the visitor's conversations (kept by session) into `user`'s account; how many moved."""
    if not session_key:
        return 0
    return Conversation.objects.filter(user__isnull=True, session_key=session_key).update(
        user=user, session_key=""
    )


LOCAL_ACCOUNTS_OFF = "Accounts here are signed in through {provider} only."


def local_accounts_refuse() -> None:
    """With CHAT_LOCAL_ACCOUNTS=0 no password is taken, set or reset: a readable 403."""
    if not settings.CHAT_LOCAL_ACCOUNTS:
        raise PermissionDenied(LOCAL_ACCOUNTS_OFF.format(provider=settings.CHAT_OIDC["name"]))


def local_accounts_only(view):
    """`view` (a password view) refused with CHAT_LOCAL_ACCOUNTS=0."""

    @functools.wraps(view)
    def guarded(request, *args, **kwargs):
        local_accounts_refuse()
        return view(request, *args, **kwargs)

    return guarded


class SignInView(LoginView):
    """The password form (unless CHAT_LOCAL_ACCOUNTS=0, when it is gone and a POST is refused)
    and the provider's button (with CHAT_OIDC)."""

    form_class = SignInForm
    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        local_accounts_refuse()
        return super().post(request, *args, **kwargs)

    def form_valid(self, form):
        visitor_session = self.request.session.session_key  # login() gives the session a new key
        response = super().form_valid(form)
        adopt_conversations(session_key=visitor_session, user=form.get_user())
        return response

    def get_context_data(self, **kwargs):
        return {
            **super().get_context_data(**kwargs),
            "signup_open": signup_open(),
            "local_accounts": settings.CHAT_LOCAL_ACCOUNTS,
            "provider": settings.CHAT_OIDC["name"] if settings.CHAT_OIDC else None,
        }


def admin_sign_in(request):
    """/admin/login/: with CHAT_OIDC a visitor is sent to the page's sign-in, which has the
    provider's button (and the password form, unless local accounts are off); a password posted
    here is the admin's own form's, refused without local accounts; a signed-in user who is not
    staff gets the admin's "not authorized" page."""
    if request.method == "POST":
        local_accounts_refuse()
    elif settings.CHAT_OIDC and not request.user.is_authenticated:
        query = urlencode({"next": request.GET.get("next", reverse("admin:index"))})
        return redirect(f"{reverse('login')}?{query}")
    return admin.site.login(request)


def signup_open() -> bool:
    """Anyone may make an account (CHAT_SIGNUP open, or confirm: after following a mailed link),
    and local accounts are on."""
    return settings.CHAT_LOCAL_ACCOUNTS and settings.CHAT_SIGNUP in {"open", "confirm"}


# The session key under which a browser keeps the account it signed up for (CHAT_SIGNUP=confirm).
PENDING_SIGNUP = "signup_pending"


@sensitive_post_parameters("password1", "password2")
@csrf_protect
@never_cache
def sign_up(request):
    """A new account (Django's UserCreationForm, with an e-mail address), throttled per address; signed in at once with
    the visitor's chats, or (CHAT_SIGNUP=confirm) inactive until its mailed link is followed."""
    local_accounts_refuse()
    if not signup_open():
        raise PermissionDenied("Sign-up is closed; ask an administrator for an account.")
    if request.user.is_authenticated:
        return redirect(settings.LOGIN_REDIRECT_URL)
    confirm = settings.CHAT_SIGNUP == "confirm"
    form = (ConfirmedSignUpForm if confirm else SignUpForm)(request.POST or None)
    if request.method == "POST":
        if wait := signup_wait(request):
            minutes = math.ceil(wait / 60)
            form.is_valid()  # so the page shows the fields as sent
            form.add_error(
                None,
                f"Too many accounts were made from your address; try again in {minutes} "
                f"minute{'' if minutes == 1 else 's'}.",
            )
            return render(request, "accounts/signup.html", {"form": form}, status=429)
        if form.is_valid():
            user = form.save(commit=False)
            user.is_active = not confirm
            user.save()
            signup_count(request)
            if confirm:
                # Only this browser's confirmation signs in and takes its chats.
                request.session[PENDING_SIGNUP] = user.pk
                _confirmation_send(request, user)
                return render(request, "accounts/signup_sent.html", {"email": user.email})
            visitor_session = request.session.session_key
            auth.login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            adopt_conversations(session_key=visitor_session, user=user)
            return redirect(settings.LOGIN_REDIRECT_URL)
    return render(request, "accounts/signup.html", {"form": form})


def _confirmation_send(request, user) -> None:
    """Mail the link that activates `user` (Django's password-reset tokens: one use, expiring
    after PASSWORD_RESET_TIMEOUT; signing in changes the hash they cover)."""
    link = request.build_absolute_uri(
        reverse(
            "signup-confirm",
            args=[
                urlsafe_base64_encode(force_bytes(user.pk)),
                default_token_generator.make_token(user),
            ],
        )
    )
    send_mail(
        "Confirm your chat account",
        f"Open this link to start using the account {user.get_username()}:\n\n{link}\n\n"
        "If you did not sign up, ignore this mail; the account stays closed.",
        None,
        [user.email],
    )


@csrf_protect
@never_cache
def sign_up_confirm(request, uidb64: str, token: str):
    """The mailed link shows a button; pressing it (a POST) opens the account. Only the browser
    that signed up is signed in and has its chats moved in: a link opened elsewhere (one an
    attacker sent a victim, say) must not sign that browser into someone else's account and hand
    over its chats, so there the account opens and its owner signs in with the password."""
    try:
        user_id = id_parse(urlsafe_base64_decode(uidb64).decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        user_id = None
    user = get_user_model().objects.filter(pk=user_id).first() if user_id else None
    if user is None or user.is_active or not default_token_generator.check_token(user, token):
        return render(request, "accounts/signup_confirm_failed.html", status=400)
    if request.method != "POST":
        return render(request, "accounts/signup_confirm.html", {"username": user.get_username()})
    user.is_active = True
    user.save(update_fields=["is_active"])
    if request.session.get(PENDING_SIGNUP) != user.pk:
        return render(request, "accounts/signup_confirmed.html", {"username": user.get_username()})
    visitor_session = request.session.session_key
    auth.login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    request.session.pop(PENDING_SIGNUP, None)
    adopt_conversations(session_key=visitor_session, user=user)
    return redirect(settings.LOGIN_REDIRECT_URL)
