"""The review of cached answers: read, approve, edit, reject, evict and reset, each against the
text the page showed."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import Truncator

from ..models import CachedAnswer
from ..stores import review
from .review_feedback import FeedbackColumns, SentBackFilter, with_feedback_counts

REDIS_LATER = (
    " (Redis is unreachable: it leaves the cache when Redis is back, and is not served meanwhile)"
)


def typed_text(value: str) -> str:
    """An answer as a browser posts it, with its line ends back to the stored ones (a textarea
    sends CRLF)."""
    return value.replace("\r\n", "\n")


class AnswerField(forms.CharField):
    """The answer's textarea: kept exactly as typed (no stripping), CRLF back to LF, so saving an
    untouched page changes nothing."""

    def __init__(self, **kwargs):
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 14, "cols": 90}))
        super().__init__(strip=False, **kwargs)

    def to_python(self, value):
        return typed_text(super().to_python(value))


class CachedAnswerForm(forms.ModelForm):
    """The answer's edit form; `seen_digest` says which text the page showed, so an edit never
    replaces a text its author did not see."""

    answer = AnswerField()
    seen_digest = forms.CharField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = CachedAnswer
        fields = ("answer",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["seen_digest"].initial = review.record_digest(self.instance)

    def clean(self):
        cleaned = super().clean()
        # The admin's save runs in one transaction: locked here, the row stays as compared
        # until the edit is written (review.answer_edit compares again under the same lock).
        current = CachedAnswer.objects.select_for_update().filter(pk=self.instance.pk).first()
        if current is None:
            raise forms.ValidationError("This answer was deleted meanwhile; nothing was saved.")
        if review.record_digest(current) != cleaned.get("seen_digest"):
            raise forms.ValidationError(
                "This answer changed since this page was loaded (edited by someone else, or "
                "refilled after an eviction). Nothing was saved: reload the page and read it "
                "again."
            )
        return cleaned


class EditedFilter(admin.SimpleListFilter):
    title = "edited in the admin"
    parameter_name = "edited"

    def lookups(self, request, model_admin):
        return (("yes", "edited"), ("no", "as generated"))

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(edited_at__isnull=self.value() == "no")
        return queryset


@admin.register(CachedAnswer)
class CachedAnswerAdmin(FeedbackColumns, admin.ModelAdmin):
    """Review of cached answers; changing anything needs the review permission.

    Approving happens on an answer's own page only: the list shows excerpts, and an approval
    vouches for the whole text, as the page that carried its digest showed it.
    """

    form = CachedAnswerForm
    # Few, narrow columns, so the review column stays in view at 1280 px beside the admin's
    # menu and the filters: the policy is a filter, the stops and regenerations are on the
    # answer's page.
    list_display = (
        "prompt_excerpt",
        "answer_excerpt",
        "review_status",
        "hits",
        "thumbs_down",
        "thumbs_up",
        "row_actions",
    )
    list_display_links = ("prompt_excerpt",)
    list_select_related = ("edited_by",)
    list_filter = (
        "status",
        SentBackFilter,
        EditedFilter,
        "policy_slug",
        "finish_reason",
        "model_id",
    )
    search_fields = ("prompt", "answer", "key")
    details: tuple[str, ...] = (
        "rendered_prompt",
        "json_value",
        "finish_reason",
        "metrics",
        "policy",
        "policy_slug",
        "policy_version",
        "model_id",
        "status",
        "hits",
        "sent_back_at",
        "feedback_since",
        "first_served_at",
        "last_served_at",
        "reviewed_by",
        "edited_by",
        "edited_at",
        "redacted_at",
        "created_at",
        "updated_at",
        "key",
    )
    readonly_fields = ("prompt", "rendered_answer", "feedback_panel", *details)
    # The text and what to do with it first (the template puts the review buttons right after
    # it), then what users said, then the record's details.
    fieldsets = (
        (None, {"fields": ("prompt", "rendered_answer", "answer", "seen_digest")}),
        ("Users' feedback", {"fields": ("feedback_panel",)}),
        ("Details", {"fields": details}),
    )
    actions = ["reject", "evict", "reset"]

    class Media:
        # The detail page renders the answer exactly as the chat page does.
        js = (
            "vendor/markdown-it/markdown-it.min.js",
            "vendor/dompurify/purify.min.js",
            "chat/markdown.js",
            "chat/admin-review.js",
        )
        css = {"all": ("chat/admin-review.css",)}

    @admin.display(description="prompt")
    def prompt_excerpt(self, obj):
        return Truncator(obj.prompt).chars(100)

    @admin.display(description="answer")
    def answer_excerpt(self, obj):
        """The excerpt rendered as the chat renders it (admin-review.js); its raw text until then."""
        excerpt = Truncator(obj.answer).chars(240)
        return format_html(
            '<div class="rendered-answer answer-excerpt" data-markdown="{}">{}</div>',
            excerpt,
            excerpt,
        )

    @admin.display(description="status", ordering="status")
    def review_status(self, obj):
        """The review status, and who edited the text (a reviewer approves an edit knowing whose
        words they are)."""
        if obj.edited_at is None:
            return obj.get_status_display()
        when = timezone.localtime(obj.edited_at).strftime("%Y-%m-%d %H:%M")
        return format_html(
            '{}<span class="edit-note">edited by {}, {}</span>',
            obj.get_status_display(),
            obj.edited_by or "a deleted user",
            when,
        )

    @admin.display(description="answer, as users see it")
    def rendered_answer(self, obj):
        return format_html(
            '<div class="rendered-answer markdown" data-markdown="{}"></div>', obj.answer
        )

    @admin.display(description="review")
    def row_actions(self, obj):
        """A link to read (and there approve) the whole answer, and a Reject button that posts
        the changelist's form (and its CSRF token) to this row."""
        buttons = []
        if obj.status != CachedAnswer.Status.APPROVED:
            buttons.append(
                format_html(
                    '<a class="button review-read" href="{}">Read to approve</a>',
                    reverse("admin:chat_cachedanswer_change", args=[obj.pk]),
                )
            )
        if obj.status != CachedAnswer.Status.REJECTED:
            buttons.append(
                format_html(
                    '<button type="submit" class="button review-reject" formaction="{}" '
                    'formmethod="post">Reject</button>',
                    reverse("admin:chat_cachedanswer_reject", args=[obj.pk]),
                )
            )
        return format_html_join(" ", "{}", ((b,) for b in buttons))

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if self.has_change_permission(request, obj):
            return fieldsets
        return [
            (name, {**opts, "fields": [f for f in opts["fields"] if f != "seen_digest"]})
            for name, opts in fieldsets
        ]

    def get_urls(self):
        review_view = self.admin_site.admin_view(self.review_row)
        return [
            path(
                "<int:pk>/approve/",
                review_view,
                {"verb": "approve"},
                name="chat_cachedanswer_approve",
            ),
            path(
                "<int:pk>/reject/", review_view, {"verb": "reject"}, name="chat_cachedanswer_reject"
            ),
            *super().get_urls(),
        ]

    def review_row(self, request, pk: int, verb: str):
        """One answer's approve (from its page) or reject (from its page or its row); back to
        where it was pressed."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_review_permission(request):
            raise PermissionDenied
        record = get_object_or_404(CachedAnswer, pk=pk)
        excerpt = Truncator(record.prompt).chars(60)
        if verb == "approve":
            approved = self._approve(request, record, excerpt)
            if approved and request.POST.get("then") == "next":
                return redirect(self._next_pending(record))
        else:
            removed = review.answer_reject(record_id=record.pk, by=request.user)
            self.message_user(request, f"Rejected: {excerpt}{'' if removed else REDIS_LATER}")
        back = request.META.get("HTTP_REFERER", "")
        if not url_has_allowed_host_and_scheme(back, {request.get_host()}):
            back = reverse("admin:chat_cachedanswer_changelist")
        return redirect(back)

    def _next_pending(self, approved: CachedAnswer) -> str:
        """The page of the next answer to review, in the order the list suggests (most
        thumbs-down first, then the oldest); the pending list once none is left."""
        following = (
            with_feedback_counts(CachedAnswer.objects.filter(status=CachedAnswer.Status.PENDING))
            .exclude(pk=approved.pk)
            .order_by("-downs", "created_at", "pk")
            .values_list("pk", flat=True)
            .first()
        )
        if following is None:
            return reverse("admin:chat_cachedanswer_changelist") + "?status__exact=pending"
        return reverse("admin:chat_cachedanswer_change", args=[following])

    def _approve(self, request, record: CachedAnswer, excerpt: str) -> bool:
        """Approve the text the page showed; True if it was approved."""
        seen = request.POST.get("seen_digest", "")
        typed = request.POST.get("answer")
        if not seen:
            self.message_user(
                request,
                "Not approved: approve on the answer's own page, after reading the whole text.",
                messages.ERROR,
            )
            return False
        typed_unsaved = typed is not None and typed_text(typed) != record.answer
        if typed_unsaved and review.record_digest(record) == seen:
            self.message_user(
                request,
                "Not approved: the text on the page was changed. Save it first, then approve "
                "the saved text.",
                messages.ERROR,
            )
            return False
        outcome = review.answer_approve(record_id=record.pk, seen_digest=seen, by=request.user)
        if outcome is review.Approval.TEXT_CHANGED:
            self.message_user(
                request,
                "Not approved: the answer changed since you opened it (edited, or refilled "
                "after an eviction). Read the text now shown and approve again.",
                messages.ERROR,
            )
            return False
        if outcome is review.Approval.GONE:
            self.message_user(request, "Not approved: the answer was deleted.", messages.ERROR)
            return False
        if outcome is review.Approval.APPROVED:
            self.message_user(
                request,
                f"Approved: {excerpt} (Redis is unreachable: it is served once it is answered "
                "again).",
                messages.WARNING,
            )
        else:
            self.message_user(request, f"Approved: {excerpt}")
        return True

    def get_queryset(self, request):
        return with_feedback_counts(super().get_queryset(request))

    def changelist_view(self, request, extra_context=None):
        pending = CachedAnswer.objects.filter(status=CachedAnswer.Status.PENDING).count()
        return super().changelist_view(request, {**(extra_context or {}), "pending_count": pending})

    def has_add_permission(self, request):
        return False  # records come from real answers only

    def has_change_permission(self, request, obj=None):
        return request.user.has_perm("chat.review_cachedanswer")

    def has_delete_permission(self, request, obj=None):
        return request.user.has_perm("chat.review_cachedanswer")

    def has_review_permission(self, request):
        return request.user.has_perm("chat.review_cachedanswer")

    def _report(self, request, verb: str, total: int, waiting: int) -> None:
        note = (
            f" {waiting} stay in Redis until it answers again; they are not served meanwhile."
            if waiting
            else ""
        )
        self.message_user(
            request,
            f"{verb} {total} answer(s).{note}",
            messages.WARNING if waiting else messages.SUCCESS,
        )

    @admin.action(
        description="Reject: evict and never cache again until reset", permissions=["review"]
    )
    def reject(self, request, queryset):
        pks = list(queryset.values_list("pk", flat=True))
        removed = sum(review.answer_reject(record_id=pk, by=request.user) for pk in pks)
        self._report(request, "Rejected", len(pks), len(pks) - removed)

    @admin.action(
        description="Evict: out of the cache; the next answer refills it", permissions=["review"]
    )
    def evict(self, request, queryset):
        pks = list(queryset.values_list("pk", flat=True))
        removed = sum(review.answer_evict(record_id=pk, by=request.user) for pk in pks)
        self._report(request, "Evicted", len(pks), len(pks) - removed)

    @admin.action(
        description="Reset rejected: the next answer is cached afresh", permissions=["review"]
    )
    def reset(self, request, queryset):
        pks = list(queryset.values_list("pk", flat=True))
        reset = sum(review.answer_reset(record_id=pk, by=request.user) for pk in pks)
        skipped = (
            f" {len(pks) - reset} not rejected, left as they were." if reset < len(pks) else ""
        )
        self.message_user(request, f"Reset {reset} rejected answer(s).{skipped}")

    def save_model(self, request, obj, form, change):
        """The edit, compared with the text the page showed and written under the row's lock;
        only the answer and its edit marks are written, never the page's stale copy of the rest."""
        outcome = review.answer_edit(
            record_id=obj.pk,
            text=obj.answer,
            seen_digest=form.cleaned_data.get("seen_digest", ""),
            by=request.user,
        )
        notes = {
            review.Edit.SERVED: "The edited answer is now served (its policy needs no review).",
            review.Edit.AWAITS_APPROVAL: "Saved; it is pending: approve it on this page to serve "
            "it.",
            review.Edit.REJECTED: "Saved; it stays rejected and is not served.",
            review.Edit.UNCHANGED: "The text is unchanged; nothing was written.",
        }
        self.message_user(request, notes[outcome])
