"""Which pages may open the chat socket: this site's own origin, scheme, host and port."""

from __future__ import annotations

from urllib.parse import urlparse

from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host


class SameOriginValidator(OriginValidator):
    """Lets a WebSocket handshake through only from a page of this site, as Django's CSRF check does.

    channels' AllowedHostsOriginValidator compares the origin's host name alone, so a
    page at http://localhost:9999 (another program on the machine) or an http:// page of an
    https site could open the socket with the visitor's cookies. Allowed here:

    - the socket's own origin: the Host header, if in ALLOWED_HOSTS, with the scheme the
      browser used (https on wss, or behind a TLS proxy that says so in the
      SECURE_PROXY_SSL_HEADER, i.e. BEHIND_TLS_PROXY), port included;
    - an origin in CSRF_TRUSTED_ORIGINS (`https://*.example.com` for subdomains).

    A handshake without an Origin or a Host header (no browser sends one) is refused.
    """

    def __init__(self, application):
        trusted = [o.replace("://*.", "://.") for o in settings.CSRF_TRUSTED_ORIGINS]
        super().__init__(application, trusted)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards WebSocket connections only")
        headers = dict(scope.get("headers", []))
        origin = headers.get(b"origin", b"").decode("latin1")
        if origin and self.allowed(urlparse(origin), scope, headers):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    def allowed(self, origin, scope, headers: dict[bytes, bytes]) -> bool:
        if origin.hostname is None:
            return False
        if self.validate_origin(origin):  # CSRF_TRUSTED_ORIGINS
            return True
        host = headers.get(b"host", b"").decode("latin1")
        if not host or not validate_host(split_domain_port(host)[0], _allowed_hosts()):
            return False
        return self.match_allowed_origin(origin, f"{_scheme(scope, headers)}://{host}")


def _allowed_hosts() -> list[str]:
    if settings.DEBUG and not settings.ALLOWED_HOSTS:  # Django's own default in DEBUG
        return [".localhost", "127.0.0.1", "[::1]"]
    return settings.ALLOWED_HOSTS


def _scheme(scope, headers: dict[bytes, bytes]) -> str:
    """The page's scheme: https for wss, or when a trusted TLS proxy's header says so."""
    if scope.get("scheme") == "wss":
        return "https"
    if settings.SECURE_PROXY_SSL_HEADER:
        name, value = settings.SECURE_PROXY_SSL_HEADER  # e.g. ("HTTP_X_FORWARDED_PROTO", "https")
        header = name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin1")
        if headers.get(header, b"").decode("latin1") == value:
            return "https"
    return "http"
