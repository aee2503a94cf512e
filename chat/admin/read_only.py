"""What nobody edits in the admin, superusers included: records kept as they were written."""


class ReadOnly:
    """A ModelAdmin mixin (first among the bases) that offers no add, change or delete."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
