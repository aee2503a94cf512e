"""The admin of engines: what each one is, who may use it, and how it is doing in this process.

A remote engine's key is never typed here: the row names an environment variable from the
operator's allow-list (CHAT_HOOKS `secrets=`), and the list shows only whether it is set.
"""

from django.contrib import admin

from ..infra.runtime import runtime
from ..models import Engine
from ..stores.engine_history import engine_rename


@admin.register(Engine)
class EngineAdmin(admin.ModelAdmin):
    # Few columns, so the list fits 1280 px: the kind shows in the model column and the filter,
    # and the health (here, last seen, last error) is one column.
    list_display = ("name", "where", "enabled", "cost_weight", "key_set", "health")
    list_filter = ("kind", "enabled")
    search_fields = ("name", "slug", "served_model", "api_root")
    prepopulated_fields = {"slug": ("name",)}
    filter_horizontal = ("groups",)
    readonly_fields = ("key_set", "state_here", "last_seen_at", "last_error")
    fieldsets = (
        (None, {"fields": ("name", "slug", "kind", "enabled")}),
        ("Local", {"fields": ("model_path",)}),
        (
            "Remote",
            {
                "fields": (
                    "api_root",
                    "served_model",
                    "api_key_variable",
                    "key_set",
                    "timeout_seconds",
                )
            },
        ),
        ("Limits and cost", {"fields": ("max_concurrency", "context_length", "cost_weight")}),
        ("Who may use it", {"fields": ("groups",)}),
        ("State", {"fields": ("state_here", "last_seen_at", "last_error")}),
    )

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and "name" in form.changed_data:  # its usage and answers keep up with it
            engine_rename(form.initial["name"], obj.name)

    @admin.display(description="model")
    def where(self, engine: Engine) -> str:
        if engine.kind == Engine.Kind.REMOTE:
            return f"{engine.served_model} at {engine.api_root}"
        return engine.model_path or "the bundled model"

    @admin.display(boolean=True, description="key set")
    def key_set(self, engine: Engine) -> bool | None:
        if engine.kind != Engine.Kind.REMOTE or not engine.api_key_variable:
            return None
        return engine.api_key_set

    @admin.display(description="health")
    def health(self, engine: Engine) -> str:
        parts = [f"here: {self.state_here(engine)}"]
        if engine.last_seen_at is not None:
            parts.append(f"last seen {engine.last_seen_at:%Y-%m-%d %H:%M}")
        if engine.last_error:
            parts.append(f"last error: {engine.last_error[:120]}")
        return "; ".join(parts)

    @admin.display(description="in this process")
    def state_here(self, engine: Engine) -> str:
        for slot in runtime.engines.slots():
            if slot.spec.id == engine.pk:
                return f"{slot.state}: {slot.detail}" if slot.detail else slot.state
        return "not used yet"
