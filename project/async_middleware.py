"""Django's own middleware, run on the event loop under ASGI instead of a thread hop each.

Django runs a `MiddlewareMixin` middleware in an async stack by sending its `process_request`
and its `process_response` through `sync_to_async(thread_sensitive=True)`: two thread hops per
middleware per request, about ten for the stack in settings.MIDDLEWARE, and a sync-only one
(WhiteNoise's) turns everything outside it into a sync island entered and left through two
more. For an API request that is most of its hops: each one a thread hand-off and the GIL
passed back and forth, while 8 users' requests arrive together with the engine using the
cores.

`install()` (called from project/asgi.py, before Django loads the middleware) gives each
`MiddlewareMixin` class of the stack an async path that runs its hooks on the event loop when
they only read and write the request and response in memory; the case that still needs the
thread (a session to save, messages to store, the CSRF token kept in the session) takes the
hop as before. The classes keep their own paths in settings.MIDDLEWARE, which Django's deploy
checks look for by name, and their sync path is untouched. WhiteNoise, sync only, is a subclass
here: a request for anything but a static file passes on the loop. The CSRF check before the
view (`process_view`, which Django's handler itself sends to the thread) passes on the loop where
it reads nothing but the request: `ViewHooksOnTheLoop`, mixed into the ASGI handler.
"""

from __future__ import annotations

from collections.abc import Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware
from whitenoise.middleware import WhiteNoiseMiddleware as _WhiteNoise

from chat.pages.csp import ContentSecurityPolicyMiddleware

Rule = Callable[..., bool]


def _never(*_args) -> bool:
    return False


def _session_to_save(request, _response) -> bool:
    """The session is loaded where it is used; saving it (changed, or saved on every request)
    is the database's work."""
    session = getattr(request, "session", None)
    return session is None or session.modified or settings.SESSION_SAVE_EVERY_REQUEST


def _csrf_in_session(*_args) -> bool:
    """The token lives in a cookie, read and set in memory, unless CSRF_USE_SESSIONS."""
    return settings.CSRF_USE_SESSIONS


def _messages_to_store(request, _response) -> bool:
    """The storage is made lazily; storing what was read or added may load the session."""
    storage = getattr(request, "_messages", None)
    return storage is not None and (storage.used or storage.added_new)


# Each class: when its process_request, and when its process_response, needs the thread. The
# CSRF check before the view is `process_view`, which Django's handler runs in the thread.
ON_THE_LOOP: dict[type, tuple[Rule, Rule]] = {
    SecurityMiddleware: (_never, _never),  # headers and the HTTPS redirect
    ContentSecurityPolicyMiddleware: (_never, _never),  # one header
    SessionMiddleware: (_never, _session_to_save),
    CommonMiddleware: (_never, _never),  # the slash redirect (URL resolving), Content-Length
    CsrfViewMiddleware: (_csrf_in_session, _csrf_in_session),
    AuthenticationMiddleware: (_never, _never),  # `request.user` is read where it is used
    MessageMiddleware: (_never, _messages_to_store),
    XFrameOptionsMiddleware: (_never, _never),  # one header
}


def _on_the_loop(request_needs_thread: Rule, response_needs_thread: Rule):
    """A MiddlewareMixin's `__acall__` that hops to a thread only where the rules say."""

    async def __acall__(self, request):
        response = None
        process_request = getattr(self, "process_request", None)
        if process_request is not None:
            if request_needs_thread(request):
                response = await sync_to_async(process_request, thread_sensitive=True)(request)
            else:
                response = process_request(request)
        response = response or await self.get_response(request)
        process_response = getattr(self, "process_response", None)
        if process_response is None:
            return response
        if response_needs_thread(request, response):
            return await sync_to_async(process_response, thread_sensitive=True)(request, response)
        return process_response(request, response)

    return __acall__


def install() -> None:
    """Every class in ON_THE_LOOP runs its hooks on the loop in an async stack from now on."""
    for middleware, (request_rule, response_rule) in ON_THE_LOOP.items():
        middleware.__acall__ = _on_the_loop(request_rule, response_rule)  # type: ignore[attr-defined]


# Methods RFC 9110 calls safe: the CSRF check accepts them without reading a token.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def csrf_view_on_the_loop(process_view):
    """CsrfViewMiddleware's bound `process_view` for an async stack: run on the loop when the
    check is done already, the view is exempt (the API's) or the method safe, where Django's
    own code only reads the request and marks it checked; in the thread, as Django sends it,
    where it reads the form's token or the session."""
    in_thread = sync_to_async(process_view, thread_sensitive=True)

    async def process_view_async(request, callback, callback_args, callback_kwargs):
        if (
            getattr(request, "csrf_processing_done", False)
            or getattr(callback, "csrf_exempt", False)
            or request.method in SAFE_METHODS
        ):
            return process_view(request, callback, callback_args, callback_kwargs)
        return await in_thread(request, callback, callback_args, callback_kwargs)

    return process_view_async


class ViewHooksOnTheLoop:
    """Mixed into an ASGI handler: the CSRF check before the view as `csrf_view_on_the_loop`
    says, every other hook adapted as Django does."""

    def adapt_method_mode(self, is_async, method, *args, **kwargs):
        if is_async and getattr(method, "__func__", None) is CsrfViewMiddleware.process_view:
            return csrf_view_on_the_loop(method)
        return super().adapt_method_mode(is_async, method, *args, **kwargs)  # type: ignore[misc]


class WhiteNoiseMiddleware(_WhiteNoise):
    """Static files. WhiteNoise is sync only; here a request for anything but a static file
    passes on the loop, and a static file is looked up and opened in the thread as before."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, settings=settings):
        super().__init__(get_response, settings=settings)
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        return super().__call__(request)

    def _found_on_disk(self, request):
        """DEBUG's lookup (autorefresh): the file's response, or None."""
        static_file = self.find_file(request.path_info)
        return self.serve(static_file, request) if static_file is not None else None

    async def _acall(self, request):
        path, response = request.path_info, None
        if not self.autorefresh:  # every file was listed at start: a lookup in memory
            static_file = self.files.get(path)
            if static_file is not None:
                response = await sync_to_async(self.serve, thread_sensitive=True)(
                    static_file, request
                )
        elif any(path.startswith(prefix) for _root, prefix in self.directories):
            response = await sync_to_async(self._found_on_disk, thread_sensitive=True)(request)
        return response or await self.get_response(request)
