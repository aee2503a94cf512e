"""The admin of budgets: each user's and API key's token and answer limits, and the default new
accounts are given. What was spent is on the usage page (/admin/usage/)."""

from django.contrib import admin

from ..models import Budget, BudgetDefault

LIMIT_FIELDS = ("daily_tokens", "monthly_tokens", "daily_answers", "monthly_answers")


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    """A budget without a key is the user's (every answer of theirs counts); with a key, that
    key's (its answers count against both). Empty limits are no limit."""

    list_display = ("user", "api_key", *LIMIT_FIELDS, "updated_at")
    list_select_related = ("user", "api_key")
    search_fields = ("user__username", "api_key__prefix", "api_key__name")
    autocomplete_fields = ("user",)
    fields = ("user", "api_key", *LIMIT_FIELDS)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "api_key":
            kwargs["queryset"] = db_field.related_model.objects.select_related("user")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(BudgetDefault)
class BudgetDefaultAdmin(admin.ModelAdmin):
    """One row: the budget a new account gets (all empty: none). Existing accounts keep theirs."""

    list_display = ("__str__", *LIMIT_FIELDS)
    fields = LIMIT_FIELDS

    def has_add_permission(self, request):
        return super().has_add_permission(request) and not BudgetDefault.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False
