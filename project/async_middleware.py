"""Django's own middleware, run on the event loop under ASGI instead of a thread hop each.

Django runs a `MiddlewareMixin` middleware in an async stack by sending its `process_request`
and its `process_response` through `sync_to_async(thread_sensitive=True)`: two thread hops per
middleware per request, about ten for the stack in settings.MIDDLEWARE, and a sync-only one
(WhiteNoise's) turns everything outside it into a sync island entered and left through two
more. For an API request that is most of its hops: each one a thread hand-off and the GIL
passed back and forth, while 8 users' requests arrive together with the engine using the
cores.

Each class here is Django's (or WhiteNoise's) own, unchanged in sync mode. In async mode it runs
its hooks on the event loop when they only read and write the request and response in memory,
which is the rule each class's docstring states with the case that still needs the thread
(a session to save, messages to store, a static file to open): that case takes the thread hop
as before.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware as _Authentication
from django.contrib.messages.middleware import MessageMiddleware as _Messages
from django.contrib.sessions.middleware import SessionMiddleware as _Sessions
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptions
from django.middleware.common import CommonMiddleware as _Common
from django.middleware.csrf import CsrfViewMiddleware as _Csrf
from django.middleware.security import SecurityMiddleware as _Security
from whitenoise.middleware import WhiteNoiseMiddleware as _WhiteNoise

from chat.pages.csp import ContentSecurityPolicyMiddleware as _ContentSecurityPolicy


class OnTheLoop:
    """Mixed in before a `MiddlewareMixin`: in async mode its hooks run on the event loop,
    except where `request_needs_thread` / `response_needs_thread` say otherwise."""

    def request_needs_thread(self, request) -> bool:  # noqa: ARG002 (overridden)
        return False

    def response_needs_thread(self, request, response) -> bool:  # noqa: ARG002 (overridden)
        return False

    async def __acall__(self, request):
        response = None
        process_request = getattr(self, "process_request", None)
        if process_request is not None:
            if self.request_needs_thread(request):
                response = await sync_to_async(process_request, thread_sensitive=True)(request)
            else:
                response = process_request(request)
        response = response or await self.get_response(request)
        process_response = getattr(self, "process_response", None)
        if process_response is not None:
            if self.response_needs_thread(request, response):
                return await sync_to_async(process_response, thread_sensitive=True)(
                    request, response
                )
            return process_response(request, response)
        return response


class SecurityMiddleware(OnTheLoop, _Security):
    """Headers and the HTTPS redirect: on the loop always."""


class ContentSecurityPolicyMiddleware(OnTheLoop, _ContentSecurityPolicy):
    """One header: on the loop always."""


class CommonMiddleware(OnTheLoop, _Common):
    """The slash redirect (URL resolving) and Content-Length: on the loop always."""


class AuthenticationMiddleware(OnTheLoop, _Authentication):
    """`request.user` is lazy (the database is read where it is used): on the loop always."""


class XFrameOptionsMiddleware(OnTheLoop, _XFrameOptions):
    """One header: on the loop always."""


class SessionMiddleware(OnTheLoop, _Sessions):
    """The session is loaded where it is used; the response needs the thread only when the
    session is to be saved (changed, or SESSION_SAVE_EVERY_REQUEST)."""

    def response_needs_thread(self, request, response) -> bool:  # noqa: ARG002
        session = getattr(request, "session", None)
        return session is None or session.modified or settings.SESSION_SAVE_EVERY_REQUEST


class CsrfViewMiddleware(OnTheLoop, _Csrf):
    """The token lives in a cookie, read and set in memory; kept in the session
    (CSRF_USE_SESSIONS), it takes the thread as before. Its check before the view is Django's
    `process_view`, which the handler still runs in the thread."""

    def request_needs_thread(self, request) -> bool:  # noqa: ARG002
        return settings.CSRF_USE_SESSIONS

    def response_needs_thread(self, request, response) -> bool:  # noqa: ARG002
        return settings.CSRF_USE_SESSIONS


class MessageMiddleware(OnTheLoop, _Messages):
    """The storage is made lazily; storing needs the thread only when messages were read or
    added (the session's storage writes to the session, which may load it)."""

    def response_needs_thread(self, request, response) -> bool:  # noqa: ARG002
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


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

    def _may_be_static(self, path: str) -> bool:
        if self.autorefresh:  # files are found on disk, under these prefixes only
            return any(path.startswith(prefix) for _root, prefix in self.directories)
        return path in self.files

    def _static_response(self, request):
        static_file = (
            self.find_file(request.path_info)
            if self.autorefresh
            else self.files.get(request.path_info)
        )
        return self.serve(static_file, request) if static_file is not None else None

    async def _acall(self, request):
        if self._may_be_static(request.path_info):
            response = await sync_to_async(self._static_response, thread_sensitive=True)(request)
            if response is not None:
                return response
        return await self.get_response(request)
