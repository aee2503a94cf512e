"""Sign up and sign in with Django's auth forms; a visitor's conversations follow them in.

Everything else (sign out, password change and reset) is Django's own views, routed in
project/urls.py, with the templates in templates/accounts/.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import auth
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm
from django.contrib.auth.views import LoginView
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.debug import sensitive_post_parameters

from ..infra.signin_throttle import ThrottledSignInMixin
from ..models import Conversation


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


class SignInView(LoginView):
    form_class = SignInForm
    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def form_valid(self, form):
        visitor_session = self.request.session.session_key  # login() gives the session a new key
        response = super().form_valid(form)
        adopt_conversations(session_key=visitor_session, user=form.get_user())
        return response

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "signup_open": signup_open()}


def signup_open() -> bool:
    return settings.CHAT_SIGNUP == "open"


@sensitive_post_parameters("password1", "password2")
@csrf_protect
@never_cache
def sign_up(request):
    """A new account (Django's UserCreationForm); signed in at once, with the visitor's chats."""
    if not signup_open():
        raise PermissionDenied("Sign-up is closed; ask an administrator for an account.")
    if request.user.is_authenticated:
        return redirect(settings.LOGIN_REDIRECT_URL)
    form = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        visitor_session = request.session.session_key
        auth.login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        adopt_conversations(session_key=visitor_session, user=user)
        return redirect(settings.LOGIN_REDIRECT_URL)
    return render(request, "accounts/signup.html", {"form": form})
