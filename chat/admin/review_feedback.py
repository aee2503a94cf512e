"""What users said of a cached answer, in its review: thumbs counted (sortable), the comments,
and the implicit signals (a Stop or Regenerate soon after a hit) shown apart."""

from django.contrib import admin
from django.db.models import Count, F, Func, IntegerField, OuterRef, Subquery
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from ..models import CachedAnswer, Feedback
from ..stores import feedback

# Comments shown in a list row: the newest thumbs-down ones.
ROW_COMMENTS = 2


def _counted(**which):
    """How many feedback rows of `which` the outer record's answer has (`feedback.on_record`)."""
    rows = (
        Feedback.objects.filter(feedback.on_record(OuterRef("pk"), OuterRef("key")), **which)
        .order_by()
        .annotate(n=Func(F("pk"), function="COUNT"))
        .values("n")
    )
    return Subquery(rows, output_field=IntegerField())


def with_feedback_counts(queryset):
    """Each record with its thumbs down and up and implicit signals, so the list sorts by them."""
    rated = Feedback.Kind.RATING
    return queryset.annotate(
        downs=_counted(kind=rated, rating=feedback.DOWN),
        ups=_counted(kind=rated, rating=feedback.UP),
        implicit=_counted(kind__in=[Feedback.Kind.STOPPED, Feedback.Kind.REGENERATED]),
    )


def _ratings(record: CachedAnswer):
    return Feedback.objects.filter(
        feedback.on_record(record, record.key), kind=Feedback.Kind.RATING
    ).order_by("-updated_at", "-id")


class SentBackFilter(admin.SimpleListFilter):
    title = "sent back by feedback"
    parameter_name = "sent_back"

    def lookups(self, request, model_admin):
        return (("yes", "sent back by thumbs-down"),)

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(sent_back_at__isnull=False)
        return queryset


class FeedbackColumns:
    """The review admin's feedback columns and its change page's feedback panel."""

    # "-downs": the first click on the column puts the most thumbs-down on top.
    @admin.display(description="thumbs down", ordering="-downs")
    def thumbs_down(self, obj):
        comments = [
            Truncator(comment).chars(80)
            for comment in _ratings(obj)
            .filter(rating=feedback.DOWN)
            .exclude(comment="")
            .values_list("comment", flat=True)[:ROW_COMMENTS]
        ]
        sent_back = (
            format_html('<strong class="sent-back">sent back to review</strong>')
            if obj.sent_back_at
            else ""
        )
        return format_html(
            '<span class="downs">{}</span> {}{}',
            getattr(obj, "downs", 0),
            sent_back,
            format_html_join("", '<q class="feedback-comment">{}</q>', ((c,) for c in comments)),
        )

    @admin.display(description="thumbs up", ordering="-ups")
    def thumbs_up(self, obj):
        return getattr(obj, "ups", 0)

    @admin.display(description="users' feedback")
    def feedback_panel(self, obj):
        """Every rating with its comment, newest first, then the implicit signals apart."""
        threshold = obj.policy.feedback_downs_to_review if obj.policy else feedback.DEFAULT_DOWNS
        counted = feedback.downs_counted(obj)
        if obj.sent_back_at:
            when = timezone.localtime(obj.sent_back_at).strftime("%Y-%m-%d %H:%M")
            head = format_html(
                "<p><strong>Sent back to review by users' thumbs-down, {}</strong>: not served "
                "until approved.</p>",
                when,
            )
        else:
            head = format_html(
                "<p>{} of {} thumbs-down from distinct users send it back to review{}.</p>",
                counted,
                threshold or "∞",
                "" if threshold else " (off for this policy)",
            )
        rows = format_html_join(
            "",
            '<li class="feedback-{}">{}, {}{}</li>',
            (
                (
                    "down" if f.rating == feedback.DOWN else "up",
                    "Thumbs down" if f.rating == feedback.DOWN else "Thumbs up",
                    timezone.localtime(f.updated_at).strftime("%Y-%m-%d %H:%M"),
                    format_html(': <q class="feedback-comment">{}</q>', f.comment)
                    if f.comment
                    else "",
                )
                for f in _ratings(obj)[:200]
            ),
        )
        implicit = dict(
            Feedback.objects.filter(feedback.on_record(obj, obj.key))
            .exclude(kind=Feedback.Kind.RATING)
            .values_list("kind")
            .annotate(n=Count("id"))
        )
        signals = format_html(
            "<p>Implicit, never sending it back: stopped {} and regenerated {} time(s) within "
            "{} s of being served.</p>",
            implicit.get(Feedback.Kind.STOPPED, 0),
            implicit.get(Feedback.Kind.REGENERATED, 0),
            int(feedback.IMPLICIT_WINDOW.total_seconds()),
        )
        ratings = (
            format_html('<ul class="feedback-list">{}</ul>', rows) if rows else "No ratings yet."
        )
        return format_html("{}{}{}", head, ratings, signals)
