"""The signed-in user's API keys page: make a key (shown once), see when each was used, revoke."""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from ..protocol.inputs import id_parse
from ..stores.apikeys import LIFETIME_CHOICES, apikey_create, apikey_revoke, keys_of


@login_required
@require_http_methods(["GET", "POST"])
def api_keys(request):
    """GET lists the keys (with `?revoke=<id>`, asking first whether to revoke that one); POST
    `create` (with a `name` and an `expires` of LIFETIME_CHOICES) or `revoke` (with a `key`)
    changes them."""
    new_key = None
    error = ""
    keys = list(keys_of(request.user))
    # Revoke is asked in the page (a link here, then a form), never by the browser's confirm().
    asked = id_parse(request.GET.get("revoke"))
    confirming = next((k for k in keys if k.pk == asked and k.is_active), None)
    if request.method == "POST":
        if "create" in request.POST:
            lifetime = request.POST.get("expires", "never")
            if lifetime not in LIFETIME_CHOICES:
                error = "Choose when the key expires from the list."
            else:
                _, new_key = apikey_create(
                    user=request.user,
                    name=request.POST.get("name", "").strip(),
                    lifetime_days=LIFETIME_CHOICES[lifetime],
                )
        elif "revoke" in request.POST:
            key_id = id_parse(request.POST.get("key"))
            if not (key_id and apikey_revoke(key_id=key_id, user=request.user)):
                error = "That key is not one of your active keys."
            else:
                return redirect("account-api-keys")
    # The new key is rendered in this response only, never stored or redirected with.
    response = render(
        request,
        "chat/api_keys.html",
        {
            "keys": [key for key in keys if key.is_active],
            # Kept (the export lists them too), but folded away under their count.
            "revoked": [key for key in keys if not key.is_active],
            "confirming": confirming,
            "new_key": new_key,
            "error": error,
            "base_url": request.build_absolute_uri("/v1"),
            "model_name": settings.CHAT_API_MODEL_NAME,
            "lifetimes": [choice for choice in LIFETIME_CHOICES if choice != "never"],
        },
        status=400 if error else 200,
    )
    response["Cache-Control"] = "no-store"
    return response
