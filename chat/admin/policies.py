"""The admin of output policies: the change form's checks, its workbench (try a draft, run the
regression set), the revision history, and the kept regression runs."""

import copy

from asgiref.sync import async_to_sync
from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import models
from django.forms.models import construct_instance
from django.http import Http404, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import path

from ..engine.sampling_params import POLICY_SETTINGS
from ..infra.audit import audit_record
from ..infra.engines import EngineSpec
from ..infra.runtime import runtime
from ..models import Engine, OutputPolicy, PolicyRevision, RegressionCase, RegressionRun
from ..stores.policy_store import compile_policy, policy_errors
from ..stores.selectors import Owner
from ..turns import regressions
from ..turns.limits import turn_rate_check
from ..turns.refusals import TurnError
from ..turns.trial import trial_run, trial_side_by_side
from .policy_fields import ExamplesField, HooksField


class PolicyRevisionInline(admin.TabularInline):
    model = PolicyRevision
    extra = 0
    fields = ("version", "changed_at", "changed_by", "changes")
    readonly_fields = fields
    can_delete = False
    verbose_name_plural = "history (who changed what, when)"
    classes = ("collapse",)  # it grows with every save

    def has_add_permission(self, request, obj=None):
        return False


# A refused trial's HTTP status: too many prompts, or no model to run it on yet.
TRIAL_REFUSED_STATUS = {"rate_limited": 429, "model_loading": 503, "server_restarting": 503}


def trial_engines(draft, chosen: list[str]) -> list[EngineSpec | None]:
    """The engines a draft is tried on: its own (None: the default) first, then those ticked in
    the workbench ("default" for the default engine, else an engine row's id)."""
    own = EngineSpec.of(draft.engine) if draft.engine is not None else None
    engines: list[EngineSpec | None] = [own]
    if "default" in chosen and own is not None:
        engines.append(None)
    ids = [int(value) for value in chosen if value.isdigit() and int(value) != draft.engine_id]
    engines += [EngineSpec.of(row) for row in Engine.objects.filter(pk__in=ids, enabled=True)]
    return engines


def audit_trial(stored, draft, kind: str) -> None:
    """A draft run on the live engine is recorded like a save: its hooks call services with the
    operator's secrets, so who tried which settings stays known though nothing was kept.
    `changes`: the fields that differ from the stored policy, and always the hooks."""
    before = OutputPolicy.objects.get(pk=stored.pk).snapshot() if stored is not None else {}
    after = draft.snapshot()
    changes = {name: [before.get(name), value] for name, value in after.items()}
    changes = {
        name: pair
        for name, pair in changes.items()
        if pair[0] != pair[1] or name == "moderation_hooks"
    }
    changes["trial"] = [None, kind]
    audit_record(
        draft,
        "outputpolicy.try",
        changes=changes,
        object_pk=str(stored.pk) if stored is not None else "",
        object_id=stored.pk if stored is not None else None,
    )


class RegressionCaseInline(admin.TabularInline):
    model = RegressionCase
    extra = 1
    fields = ("prompt", "expected")
    verbose_name_plural = "regression set (run it from the workbench below before saving)"
    formfield_overrides = {
        # One line a prompt keeps a set of twenty readable.
        models.TextField: {"widget": forms.Textarea(attrs={"rows": 1, "cols": 60})},
    }

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        """Each row's boxes named for a screen reader: a table's header is not their label."""
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None:
            field.widget.attrs["aria-label"] = f"Regression case: {db_field.verbose_name}"
        return field


@admin.register(RegressionRun)
class RegressionRunAdmin(admin.ModelAdmin):
    """The runs of every policy's regression set, kept to compare pass rates; made by running."""

    list_display = ("policy", "policy_version", "draft", "passed", "total", "ran_by", "ran_at")
    list_filter = ("policy", "draft")
    readonly_fields = (
        "policy",
        "policy_version",
        "draft",
        "ran_by",
        "ran_at",
        "passed",
        "total",
        "results",
    )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class OutputPolicyForm(forms.ModelForm):
    """Refuses a policy that could not work, with the reason on the field staff must change."""

    moderation_hooks = HooksField(
        required=False, help_text=OutputPolicy._meta.get_field("moderation_hooks").help_text
    )
    examples = ExamplesField(
        required=False, help_text=OutputPolicy._meta.get_field("examples").help_text
    )

    class Meta:
        model = OutputPolicy
        fields = "__all__"  # noqa: DJ007 (the admin's fieldsets choose and order them)

    def clean(self):
        cleaned = super().clean()
        # The policy as it would be saved; the stored row is untouched until it passes.
        candidate = construct_instance(self, copy.copy(self.instance))
        for field, problems in policy_errors(candidate, tokenizer=runtime.tokenizer()).items():
            for problem in problems:
                self.add_error(field if field in self.fields else None, problem)
        return cleaned


# The decoding settings shown open, in "The answer"; the rest are folded.
OPEN_SETTINGS = ("max_new_tokens", "temperature")


@admin.register(OutputPolicy)
class OutputPolicyAdmin(admin.ModelAdmin):
    form = OutputPolicyForm
    list_display = (
        "name",
        "slug",
        "mode",
        "engine",
        "is_default",
        "version",
        "cache_enabled",
        "updated_at",
    )
    list_filter = ("mode", "is_default", "cache_enabled")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("version", "updated_at")
    inlines = [RegressionCaseInline, PolicyRevisionInline]
    change_form_template = "admin/chat/outputpolicy/change_form.html"
    # The common edit (what the policy is, its prompt and length, a schema, the cache) stays
    # open; what is rarely changed is folded (Django's collapsed fieldsets), so the form fits in
    # about two screens at 1280x800 instead of five. A folded fieldset with an error opens by
    # itself (static/chat/admin-policy-form.js).
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "name",
                    "description",
                    ("slug", "is_default"),
                    "mode",
                    ("engine", "fallback_engine", "fallback_to_default"),
                    ("version", "updated_at"),
                )
            },
        ),
        (
            "The answer",
            {"fields": ("system_prompt", ("max_new_tokens", "temperature"), "json_schema")},
        ),
        (
            "Checks before anyone sees the answer",
            {
                "classes": ("collapse",),
                "fields": (
                    "constrained",
                    "moderation_hooks",
                    "blocklist_terms",
                    "holdback_chars",
                    ("failure_action", "max_retries"),
                    "fallback_text",
                    "show_failed_text",
                ),
            },
        ),
        (
            "Sampling, examples and stopping",
            {
                "classes": ("collapse",),
                # The other decoding settings a policy stores, in SamplingParams' order.
                "fields": (
                    "examples",
                    *(name for name in POLICY_SETTINGS if name not in OPEN_SETTINGS),
                    "extra_eos_tokens",
                ),
            },
        ),
        (
            "Cache",
            {
                "fields": (
                    ("cache_enabled", "cache_ttl_seconds"),
                    ("require_review", "feedback_downs_to_review"),
                )
            },
        ),
    )

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        """Text boxes three lines high (they grow by hand): ten-line ones made the form tall."""
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None and isinstance(field.widget, forms.Textarea):
            field.widget.attrs["rows"] = 3
        return field

    class Media:
        js = ("chat/admin-trial.js", "chat/admin-policy-form.js")
        css = {"all": ("chat/admin-trial.css",)}

    def get_urls(self):
        trial = self.admin_site.admin_view(self.try_draft)
        return [
            path("try/", trial, name="chat_outputpolicy_try_new"),
            path("<path:object_id>/try/", trial, name="chat_outputpolicy_try"),
            path(
                "<path:object_id>/regressions/",
                self.admin_site.admin_view(self.run_regressions),
                name="chat_outputpolicy_regressions",
            ),
            *super().get_urls(),
        ]

    def _draft_form(self, request, stored):
        """The change form bound to what the page posted, for a policy staff may change."""
        allowed = (
            self.has_change_permission(request, stored)
            if stored is not None
            else self.has_add_permission(request)
        )
        if not allowed:
            raise PermissionDenied
        return self.get_form(request, stored, change=stored is not None)(
            request.POST, instance=stored
        )

    def _posted_cases(self, request, stored) -> tuple[list[tuple[str, str]], object]:
        """The regression set as typed on the page (unsaved rows included, deleted ones left
        out), else the stored one; and the inline formset, whose errors refuse the run."""
        formset_class = RegressionCaseInline(self.model, self.admin_site).get_formset(
            request, stored
        )
        prefix = formset_class.get_default_prefix()
        if f"{prefix}-TOTAL_FORMS" not in request.POST:
            stored_cases = stored.regression_cases.values_list("prompt", "expected")
            return [(p, e) for p, e in stored_cases], None
        formset = formset_class(request.POST, instance=stored, prefix=prefix)
        if not formset.is_valid():
            return [], formset
        cases = [
            (form.cleaned_data["prompt"], form.cleaned_data["expected"])
            for form in formset.forms
            if form.cleaned_data
            and not form.cleaned_data.get("DELETE")
            and form.cleaned_data.get("prompt", "").strip()
        ]
        return cases, None

    def run_regressions(self, request, object_id):
        """POST the change form: the regression set (as typed) through the unsaved draft, all at
        once on the live engine; the run is kept and shown beside the one before it."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        stored = self.get_object(request, unquote(object_id))
        if stored is None:
            raise Http404("no such policy")
        form = self._draft_form(request, stored)
        cases, bad_cases = self._posted_cases(request, stored)
        context = {"form": form, "cases_formset": bad_cases, "run": None, "problem": ""}
        status = 200
        if not form.is_valid():
            context["problem"], status = "The draft would not save; nothing was run.", 400
        elif bad_cases is not None:
            context["problem"], status = "The regression set has errors; nothing was run.", 400
        elif not cases:
            context["problem"], status = "Add a prompt to the regression set first.", 400
        else:
            unsaved = form.save(commit=False)
            draft = compile_policy(unsaved)
            try:
                turn_rate_check(owner=Owner(request.user.pk, ""))  # the run counts as one prompt
                audit_trial(stored, unsaved, "regression set")
                results = async_to_sync(regressions.regressions_run)(
                    draft, cases, trial_engines(unsaved, [])[0]
                )
            except TurnError as exc:
                context["problem"] = str(exc)
                status = TRIAL_REFUSED_STATUS.get(exc.code, 400)
            else:
                run = regressions.run_record(
                    policy_id=stored.pk,
                    version=stored.version,
                    draft=True,
                    user_id=request.user.pk,
                    results=results,
                )
                context["run"], context["previous"] = run, regressions.previous_run(run)
        return TemplateResponse(
            request, "admin/chat/outputpolicy/regressions_result.html", context, status=status
        )

    def change_view(self, request, object_id, form_url="", extra_context=None):
        last = RegressionRun.objects.filter(policy_id=unquote(object_id)).first()
        return super().change_view(
            request,
            object_id,
            form_url,
            {
                **(extra_context or {}),
                "last_regression_run": last,
                "trial_engines": Engine.objects.filter(enabled=True),
            },
        )

    def add_view(self, request, form_url="", extra_context=None):
        engines = Engine.objects.filter(enabled=True)
        return super().add_view(
            request, form_url, {**(extra_context or {}), "trial_engines": engines}
        )

    def try_draft(self, request, object_id=None):
        """POST the change form's current values and `trial_prompt`: the unsaved draft answers it
        on the live engine (chat/turns/trial.py); an HTML fragment for the page's panel."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        stored = None
        if object_id is not None:
            stored = self.get_object(request, unquote(object_id))
            if stored is None:
                raise Http404("no such policy")
        form = self._draft_form(request, stored)
        prompt = request.POST.get("trial_prompt", "").strip()
        context = {"prompt": prompt, "form": form, "result": None, "problem": ""}
        status = 200
        if not prompt:
            context["problem"], status = "Type a prompt to try the draft with.", 400
        elif len(prompt) > settings.CHAT_MAX_PROMPT_CHARS:
            context["problem"] = (
                f"the prompt is {len(prompt)} characters; the limit is "
                f"{settings.CHAT_MAX_PROMPT_CHARS}"
            )
            status = 400
        elif not form.is_valid():  # the same checks as on save: nothing runs
            context["problem"], status = "The draft would not save; nothing was run.", 400
        else:
            draft = form.save(commit=False)  # only in memory: the stored row is untouched
            audit_trial(stored, draft, "prompt")
            try:
                engines = trial_engines(draft, request.POST.getlist("trial_engines"))
                if len(engines) == 1:
                    context["result"] = async_to_sync(trial_run)(
                        policy=compile_policy(draft),
                        text=prompt,
                        user_id=request.user.pk,
                        engine=engines[0],
                    )
                else:  # side by side: the draft's own engine first
                    trials = async_to_sync(trial_side_by_side)(
                        policy=compile_policy(draft),
                        text=prompt,
                        user_id=request.user.pk,
                        engines=engines,
                    )
                    context["result"], context["problem"] = trials[0].result, trials[0].problem
                    context["side_by_side"] = trials
            except TurnError as exc:
                context["problem"] = str(exc)
                status = TRIAL_REFUSED_STATUS.get(exc.code, 400)
        return TemplateResponse(
            request, "admin/chat/outputpolicy/trial_result.html", context, status=status
        )

    def save_model(self, request, obj, form, change):
        before = OutputPolicy.objects.get(pk=obj.pk).snapshot() if change else {}
        super().save_model(request, obj, form, change)
        after = obj.snapshot()
        changes = {
            name: [before.get(name), value]
            for name, value in after.items()
            if before.get(name) != value
        }
        if changes:
            PolicyRevision.objects.create(
                policy=obj,
                version=obj.version,
                changed_by=request.user,
                changes=changes,
                snapshot=after,
            )
