"""/healthz (readiness for a load balancer, details kept for the log) and /metrics (Prometheus,
for CHAT_METRICS_TOKEN's bearer only)."""

import hmac

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .readiness import health, public

METRICS_OFF = (
    "/metrics is off. Set CHAT_METRICS_TOKEN on the server and send it as "
    "'Authorization: Bearer <token>' (docs/operations.md, Metrics).\n"
)


def _bearer_matches(request, token: str) -> bool:
    """The request carries `Authorization: Bearer <token>`; compared in constant time."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics(request):
    """Prometheus text format, for a scraper holding CHAT_METRICS_TOKEN only.

    The counts are not harmless to a stranger: reused prefix tokens go up when a prompt starts
    like someone else's recent conversation, so an open /metrics would tell a probe whether
    another user's conversation begins with what it guessed. Without a token set it is off.
    """
    token = settings.CHAT_METRICS_TOKEN
    if not token:
        return HttpResponse(METRICS_OFF, status=404, content_type="text/plain; charset=utf-8")
    if not _bearer_matches(request, token):
        response = HttpResponse(
            "/metrics needs 'Authorization: Bearer <CHAT_METRICS_TOKEN>'.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@require_GET
def healthz(request):
    ready, report = health()
    shown = public(report, staff=request.user.is_active and request.user.is_staff)
    return JsonResponse(shown, status=200 if ready else 503)
