"""The chat page, the conversation JSON API and /healthz."""

from django.conf import settings
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import selectors
from .health import health
from .models import OutputPolicy
from .runtime import runtime


@require_GET
def index(request):
    owner = selectors.owner_of_request(request)
    current = request.GET.get("c")
    current_id = int(current) if current and current.isdigit() else None
    if current_id is not None and selectors.conversation_detail(owner, current_id) is None:
        current_id = None
    conversations = selectors.conversation_list(owner)
    model_name = (
        runtime.backend.model_id
        if runtime.backend
        else (settings.CHAT_MODEL_PATH or "SmolLM2-135M-Instruct")
    )
    return render(
        request,
        "chat/index.html",
        {
            "conversations": conversations,
            "current_conversation_id": current_id,
            "max_prompt_chars": settings.CHAT_MAX_PROMPT_CHARS,
            "policies": OutputPolicy.objects.only("slug", "name", "mode", "is_default"),
            "model_name": model_name,
            "signup_open": settings.CHAT_SIGNUP == "open",
            "chat_config": {
                "maxPromptChars": settings.CHAT_MAX_PROMPT_CHARS,
                "conversation": current_id,
                "wsPath": "/ws/chat/",
            },
        },
    )


@require_GET
def conversations(request):
    owner = selectors.owner_of_request(request)
    return JsonResponse({"conversations": selectors.conversation_list(owner)})


@require_GET
def conversation(request, conversation_id: int):
    detail = selectors.conversation_detail(selectors.owner_of_request(request), conversation_id)
    if detail is None:
        raise Http404("no such conversation")
    return JsonResponse(detail)


@require_GET
def metrics(request):
    """Prometheus text format; scrape it, or read the plots in the admin."""
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@require_GET
def healthz(request):
    ready, report = health()
    return JsonResponse(report, status=200 if ready else 503)
