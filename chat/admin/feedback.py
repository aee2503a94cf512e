"""Users' feedback, all of it in one list: what they said of which answer, filterable by policy,
rating and comment, each row linking to the review page of the cached answer it counts on.
Read only: feedback is what users said, never edited in the admin."""

from django.contrib import admin
from django.db.models import Case, OuterRef, Subquery, When
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from ..models import CachedAnswer, Feedback, Message
from .read_only import ReadOnly


class RatingFilter(admin.SimpleListFilter):
    title = "rating"
    parameter_name = "rating"

    def lookups(self, request, model_admin):
        return (("down", "thumbs down"), ("up", "thumbs up"), ("implicit", "stop or regenerate"))

    def queryset(self, request, queryset):
        if self.value() == "down":
            return queryset.filter(kind=Feedback.Kind.RATING, rating=-1)
        if self.value() == "up":
            return queryset.filter(kind=Feedback.Kind.RATING, rating=1)
        if self.value() == "implicit":
            return queryset.exclude(kind=Feedback.Kind.RATING)
        return queryset


class CommentFilter(admin.SimpleListFilter):
    title = "has comment"
    parameter_name = "commented"

    def lookups(self, request, model_admin):
        return (("yes", "with a comment"), ("no", "without"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.exclude(comment="")
        if self.value() == "no":
            return queryset.filter(comment="")
        return queryset


def _review_record():
    """The cached answer a feedback row counts on (chat/stores/feedback.py, `on_record`): the one
    its message was served from, or the one its finished answer's identity made."""
    made = CachedAnswer.objects.filter(key=OuterRef("message__identity")).values("pk")[:1]
    return Coalesce(
        "message__cached_answer",
        Case(When(message__status=Message.Status.DONE, then=Subquery(made))),
    )


@admin.register(Feedback)
class FeedbackAdmin(ReadOnly, admin.ModelAdmin):
    """Readable by reviewers (the review permission) and by whoever may view feedback."""

    list_display = ("rating_shown", "comment_excerpt", "policy_shown", "answer_link", "updated_at")
    list_filter = ("message__policy", RatingFilter, CommentFilter)
    search_fields = ("comment",)
    list_select_related = ("message__policy",)
    fields = ("rating_shown", "comment", "policy_shown", "answer_link", "created_at", "updated_at")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(record_id=_review_record())

    @admin.display(description="rating", ordering="rating")
    def rating_shown(self, obj):
        if obj.kind != Feedback.Kind.RATING:
            return obj.get_kind_display()
        return "Thumbs down" if obj.rating == -1 else "Thumbs up"

    @admin.display(description="comment")
    def comment_excerpt(self, obj):
        return Truncator(obj.comment).chars(160)

    @admin.display(description="policy", ordering="message__policy__slug")
    def policy_shown(self, obj):
        return obj.message.policy.slug if obj.message.policy else "none"

    @admin.display(description="cached answer")
    def answer_link(self, obj):
        if obj.record_id is None:
            return "not cached"
        return format_html(
            '<a class="feedback-review" href="{}">review it</a>',
            reverse("admin:chat_cachedanswer_change", args=[obj.record_id]),
        )

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or request.user.has_perm(
            "chat.review_cachedanswer"
        )

    def has_module_permission(self, request):
        return self.has_view_permission(request)
