"""ASGI entry point: HTTP through Django, WebSockets through Channels; starts loading the model."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup(set_prefix=False)  # async_middleware imports Django's middleware, which need the apps

from project import async_middleware  # noqa: E402

# Before Django loads the middleware: their hooks on the event loop, not a thread hop each.
async_middleware.install()

from project.request_threads import KeptThreadsASGIHandler  # noqa: E402


class DjangoHandler(async_middleware.ViewHooksOnTheLoop, KeptThreadsASGIHandler):
    """Django's handler: each request's sync code in a thread kept for the next request, the
    CSRF check before a view on the loop where it reads only the request."""


django_asgi_app = DjangoHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from chat.infra.runtime import runtime  # noqa: E402
from chat.transports.origin import SameOriginValidator  # noqa: E402
from chat.transports.routing import websocket_urlpatterns  # noqa: E402
from chat.transports.sse import ServerSend  # noqa: E402
from project import socket_writes, websocket_limits  # noqa: E402
from project.shutdown import RequestsInFlight, Stopper  # noqa: E402

# Counted, so a SIGTERM lets the open responses (server-sent streams) end before the stop.
# ServerSend: a server-sent stream writes its body straight to daphne (chat/transports/sse.py).
http_requests = RequestsInFlight(ServerSend(django_asgi_app))

application = ProtocolTypeRouter(
    {
        "http": http_requests,
        # Scheme, host and port of the page must be this site's (or in CSRF_TRUSTED_ORIGINS).
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

if settings.CHAT_LOAD_MODEL:
    runtime.start()

Stopper(http_requests).install()
websocket_limits.install()  # an oversized message gets frame_too_large and 1009, not a drop
socket_writes.install()  # a write goes out at once, not on the loop's next turn
