"""The admin of accounts (users) and their API keys: deletion as users do it themselves, keys
shown once and revoked, never deleted."""

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from ..models import ApiKey
from ..stores import erasure
from ..stores.apikeys import apikeys_revoke, new_key

User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class AccountAdmin(UserAdmin):
    """Deleting a user here is the deletion users can do themselves (chat/stores/erasure.py): API keys
    revoked first, conversations, cached answers only they held, sessions."""

    def delete_model(self, request, obj):
        erasure.account_erase(user=obj)

    def delete_queryset(self, request, queryset):
        for user in queryset:
            erasure.account_erase(user=user)

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        # An account's keys go with it (revoked first); a key alone still cannot be deleted.
        perms_needed.discard(ApiKey._meta.verbose_name)
        return deleted, counts, perms_needed, protected


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Staff make keys for any user (shown once, after saving) and revoke them; never delete:
    the key stays as the record of the conversations made with it."""

    list_display = (
        "prefix",
        "name",
        "user",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "user__username")
    fields = ("user", "name", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    autocomplete_fields = ("user",)
    actions = ["revoke"]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields + (("user",) if obj else ())

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        key = None if change else new_key(obj)
        super().save_model(request, obj, form, change)
        if key is not None:
            messages.warning(request, f"The new key for {obj.user}, shown only this once: {key}")

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset):
        count = apikeys_revoke(queryset)  # and their running answers stopped
        messages.success(request, f"revoked {count} key(s)")
