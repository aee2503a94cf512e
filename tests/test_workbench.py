"""The policy workbench in the admin: "Try this draft" runs the unsaved form on the live engine
and stores, publishes and caches nothing."""

from __future__ import annotations

import io
import json
import re

import pytest
import redis
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from chat.infra.ratelimit import prompt_limiter
from chat.models import (
    CachedAnswer,
    Conversation,
    Message,
    OutputPolicy,
    RegressionCase,
    RegressionRun,
)
from chat.turns.regressions import outcomes_of
from chat.turns.trial import TrialResult
from tests.conftest import TEST_CACHE_URL

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
}


def form_data(policy: OutputPolicy, **changes) -> dict:
    """The change form's fields as the page posts them, with `changes` typed in (unsaved)."""
    data = {
        "name": policy.name,
        "slug": policy.slug,
        "mode": policy.mode,
        "json_schema": "" if policy.json_schema is None else json.dumps(policy.json_schema),
        "examples": json.dumps(policy.examples or []),
        "moderation_hooks": json.dumps(policy.moderation_hooks or []),
        "blocklist_terms": policy.blocklist_terms,
        "failure_action": policy.failure_action,
        "fallback_text": policy.fallback_text,
        "max_retries": str(policy.max_retries),
        "system_prompt": policy.system_prompt,
        "max_new_tokens": str(policy.max_new_tokens),
        "stop_strings": json.dumps(policy.stop_strings or []),
        "extra_eos_tokens": json.dumps(policy.extra_eos_tokens or []),
        "temperature": str(policy.temperature),
        "top_p": str(policy.top_p),
        "repetition_penalty": str(policy.repetition_penalty),
        "no_repeat_ngram_size": str(policy.no_repeat_ngram_size),
        "frequency_penalty": str(policy.frequency_penalty),
        "presence_penalty": str(policy.presence_penalty),
        "holdback_chars": str(policy.holdback_chars),
        "cache_enabled": "on" if policy.cache_enabled else "",
        "cache_ttl_seconds": str(policy.cache_ttl_seconds),
        "feedback_downs_to_review": str(policy.feedback_downs_to_review),
    }
    for name, value in changes.items():
        data[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return {name: value for name, value in data.items() if value != ""}


def text_of(html: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S)
    assert match, f"no #{element_id} in {html[:2000]}"
    return match.group(1)


@pytest.fixture
def staff_client(db):
    client = Client()
    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    return client


def try_url(policy: OutputPolicy) -> str:
    return f"/admin/chat/outputpolicy/{policy.pk}/try/"


def nothing_stored(policy: OutputPolicy, version: int) -> None:
    assert not Conversation.objects.exists() and not Message.objects.exists()
    assert not CachedAnswer.objects.exists()
    assert OutputPolicy.objects.get(pk=policy.pk).version == version
    assert redis.Redis.from_url(TEST_CACHE_URL).dbsize() == 0


@pytest.mark.integration
def test_a_draft_answers_on_the_live_model_and_nothing_is_stored(
    runtime, make_policy, staff_client
):
    policy = make_policy(slug="plain", max_new_tokens=8, cache_enabled=True)
    page = staff_client.get(f"/admin/chat/outputpolicy/{policy.pk}/change/").content.decode()
    assert 'id="trial-panel"' in page and "admin-trial.js" in page
    response = staff_client.post(
        try_url(policy), {**form_data(policy, max_new_tokens=6), "trial_prompt": "Say hello."}
    )
    html = response.content.decode()
    assert response.status_code == 200, html
    raw, shown = text_of(html, "trial-raw"), text_of(html, "trial-shown")
    assert raw.strip() and shown == raw  # plain prose: the user gets what the model wrote
    assert "new_tokens</span> 6" in html  # the draft's limit, not the stored 8
    assert "ttft_ms" in html and "total_ms" in html
    nothing_stored(policy, version=1)


@pytest.mark.integration
def test_a_draft_that_stays_invalid_shows_each_reask_and_the_fallback(
    runtime, make_policy, staff_client
):
    policy = make_policy(slug="js", max_new_tokens=12)
    impossible = {"type": "object", "required": ["never_there"], "additionalProperties": False}
    draft = form_data(
        policy,
        mode="buffer",
        json_schema=impossible,
        max_retries=1,
        failure_action="fallback",
        fallback_text="Sorry, no answer.",
    )
    response = staff_client.post(try_url(policy), {**draft, "trial_prompt": "Give me JSON."})
    html = response.content.decode()
    assert response.status_code == 200, html
    assert 'data-finish="invalid"' in html
    assert text_of(html, "trial-shown") == "Sorry, no answer."
    assert "Re-asked 1 time" in html
    assert text_of(html, "trial-raw").strip()  # the model's own text stays visible beside it
    nothing_stored(policy, version=1)


@pytest.mark.integration
def test_a_draft_hook_that_fires_says_which_and_why(runtime, make_policy, staff_client):
    """A hook that vetoes any visible character: the user gets nothing, and the panel says why."""
    policy = make_policy(slug="mod", max_new_tokens=16)
    veto_all = [{"hook": "blocklist", "settings": {"patterns": ["\\S"]}}]
    response = staff_client.post(
        try_url(policy),
        {**form_data(policy, moderation_hooks=veto_all), "trial_prompt": "Tell me about the sea."},
    )
    html = response.content.decode()
    assert response.status_code == 200, html
    assert 'data-finish="moderated"' in html and 'data-fired="moderated"' in html
    assert "blocked pattern" in text_of(html, "trial-reason")
    assert text_of(html, "trial-shown") == ""
    assert text_of(html, "trial-raw").strip()  # what the model wrote, for staff only
    assert "retract" in html  # the event the user's client would have received
    nothing_stored(policy, version=1)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"json_schema": {"type": "objekt"}}, "json_schema", "not a valid JSON Schema"),
        ({"moderation_hooks": [{"hook": "no.such.Hook"}]}, "moderation_hooks", "no.such.Hook"),
        (
            {"moderation_hooks": [{"hook": "blocklist", "settings": {"patterns": ["("]}}]},
            "moderation_hooks",
            "(",
        ),
    ],
)
def test_a_draft_that_would_not_save_runs_nothing(
    runtime, make_policy, staff_client, changes, field, message
):
    policy = make_policy(slug="bad")
    response = staff_client.post(
        try_url(policy), {**form_data(policy, **changes), "trial_prompt": "Hi"}
    )
    html = response.content.decode()
    assert response.status_code == 400
    errors = text_of(html, "trial-form-errors") + html
    assert field in errors and message in errors
    assert 'id="trial-verdict"' not in html
    assert prompt_limiter.wait(f"user:{User.objects.get().pk}") == 0  # not even counted


@pytest.mark.unit
@pytest.mark.django_db
def test_only_staff_may_try_and_only_by_post(staff_client):
    policy = OutputPolicy.objects.create(name="p", slug="p")
    assert staff_client.get(try_url(policy)).status_code == 405
    member = Client()
    member.force_login(User.objects.create_user("member", password="pw"))
    refused = member.post(try_url(policy), {**form_data(policy), "trial_prompt": "Hi"})
    assert refused.status_code == 302 and "/admin/login/" in refused["Location"]
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="staff"))
    assert strict.post(try_url(policy), {"trial_prompt": "Hi"}).status_code == 403


@pytest.mark.unit
@pytest.mark.django_db
def test_a_trial_is_rate_limited_like_a_turn_and_says_when_the_model_is_loading(
    staff_client, monkeypatch
):
    from chat.infra.runtime import Runtime
    from chat.turns import trial

    monkeypatch.setattr(trial, "runtime", Runtime())  # a process whose model has not loaded yet
    policy = OutputPolicy.objects.create(name="p", slug="p")
    data = {**form_data(policy), "trial_prompt": "Hi"}
    # A readable refusal, not an error page.
    loading = staff_client.post(try_url(policy), data)
    assert loading.status_code == 503
    assert "still loading" in text_of(loading.content.decode(), "trial-problem")
    key = f"user:{User.objects.get().pk}"
    while prompt_limiter.check(key) == 0:
        pass
    limited = staff_client.post(try_url(policy), data)
    assert limited.status_code == 429
    assert "too many prompts" in text_of(limited.content.decode(), "trial-problem")
    empty = staff_client.post(try_url(policy), {**data, "trial_prompt": "  "})
    assert empty.status_code == 400
    prompt_limiter.clear()
    # A policy not saved yet is tried from the add page; its form is checked like a new one's.
    taken = staff_client.post("/admin/chat/outputpolicy/try/", data)
    assert taken.status_code == 400 and "slug" in taken.content.decode()
    fresh = staff_client.post("/admin/chat/outputpolicy/try/", {**data, "slug": "fresh"})
    assert fresh.status_code == 503


# -- the regression set -------------------------------------------------------------------------


def trial_result(**fields) -> TrialResult:
    return TrialResult(prompt="p", **fields)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "outcomes"),
    [
        (
            {"raw_text": "Hi.", "text": "Hi.", "finish_reason": "eos", "outcome": "ok"},
            {"delivered"},
        ),
        (
            {"raw_text": '{"a":1}', "text": '{"a":1}', "finish_reason": "eos", "outcome": "ok"}
            | {"json_value": {"a": 1}},
            {"delivered", "valid_json"},
        ),
        (
            {"raw_text": "bad", "text": "", "finish_reason": "moderated", "outcome": "moderated"},
            {"moderated"},
        ),
        (
            {
                "raw_text": "mail a@b.c",
                "text": "mail [email]",
                "finish_reason": "eos",
                "outcome": "ok",
            },
            {"masked"},
        ),
        (
            {"raw_text": "Red. Red. Red.", "text": "Red.", "finish_reason": "cut", "outcome": "ok"},
            {"cut"},
        ),
        (
            {"raw_text": "nope", "text": "Sorry", "finish_reason": "invalid", "outcome": "invalid"},
            set(),
        ),
        ({"raw_text": "", "text": "", "error": "boom"}, set()),
    ],
)
def test_each_answer_satisfies_exactly_its_expected_outcomes(fields, outcomes):
    assert outcomes_of(trial_result(**fields)) == outcomes


def cases_data(*cases: tuple[str, str], stored: int = 0) -> dict:
    """The regression inline as the page posts it: `stored` existing rows first, then new ones."""
    data = {
        "regression_cases-TOTAL_FORMS": str(len(cases)),
        "regression_cases-INITIAL_FORMS": str(stored),
        "regression_cases-MIN_NUM_FORMS": "0",
        "regression_cases-MAX_NUM_FORMS": "1000",
    }
    for n, (prompt, expected) in enumerate(cases):
        data[f"regression_cases-{n}-prompt"] = prompt
        data[f"regression_cases-{n}-expected"] = expected
    return data


@pytest.mark.integration
def test_the_regression_set_as_typed_runs_through_the_draft_and_is_kept(
    runtime, make_policy, staff_client
):
    policy = make_policy(slug="reg", max_new_tokens=8)
    stored_case = RegressionCase.objects.create(
        policy=policy, prompt="Say hello.", expected="delivered"
    )
    url = f"/admin/chat/outputpolicy/{policy.pk}/regressions/"
    page = staff_client.get(f"/admin/chat/outputpolicy/{policy.pk}/change/").content.decode()
    assert 'id="regressions-run"' in page and "Not run yet." in page
    data = {
        **form_data(policy),
        **cases_data(("Say hello.", "delivered"), ("Name a colour.", "moderated"), stored=1),
        "regression_cases-0-id": str(stored_case.pk),
        "regression_cases-0-policy": str(policy.pk),
    }
    first = staff_client.post(url, data)
    html = first.content.decode()
    assert first.status_code == 200, html
    assert 'data-passed="1" data-total="2"' in html and "the first run of this policy" in html
    run = RegressionRun.objects.get()
    assert (run.policy_id, run.policy_version, run.draft, run.passed, run.total) == (
        policy.pk,
        1,
        True,
        1,
        2,
    )
    assert [r["expected"] for r in run.results] == ["delivered", "moderated"]
    assert run.results[1]["got"] == ["delivered"] and not run.results[1]["passed"]

    # The draft now vetoes everything: the second case passes, the first fails; beside the last.
    veto_all = [{"hook": "blocklist", "settings": {"patterns": ["\\S"]}}]
    second = staff_client.post(url, {**data, **form_data(policy, moderation_hooks=veto_all)})
    html = second.content.decode()
    assert 'data-passed="1" data-total="2"' in html
    assert "the run before: 1 of 2 (50%), version 1 draft" in html
    assert RegressionRun.objects.count() == 2
    # Only the typed rows ran; nothing was saved of them, nor any conversation.
    assert RegressionCase.objects.count() == 1
    nothing_stored(policy, version=1)
    page = staff_client.get(f"/admin/chat/outputpolicy/{policy.pk}/change/").content.decode()
    assert "Last run: 1 of 2 passed (50%)" in page


@pytest.mark.integration
def test_a_regression_set_with_errors_or_no_cases_runs_nothing(runtime, make_policy, staff_client):
    policy = make_policy(slug="reg-bad")
    url = f"/admin/chat/outputpolicy/{policy.pk}/regressions/"
    empty = staff_client.post(url, {**form_data(policy), **cases_data()})
    assert empty.status_code == 400 and "Add a prompt" in empty.content.decode()
    bad = staff_client.post(url, {**form_data(policy), **cases_data(("Hi", "great"))})
    assert bad.status_code == 400
    assert "regression case 1, expected" in bad.content.decode()
    assert not RegressionRun.objects.exists()


@pytest.mark.integration
def test_the_command_runs_the_stored_set_and_fails_on_a_miss(runtime, make_policy):
    policy = make_policy(slug="reg-cli", max_new_tokens=6)
    RegressionCase.objects.create(policy=policy, prompt="Say hello.", expected="delivered")
    out = io.StringIO()
    call_command("policyregressions", "reg-cli", stdout=out, stderr=io.StringIO())
    assert "1 of 1 passed (100%)" in out.getvalue()
    RegressionCase.objects.create(policy=policy, prompt="Say hi.", expected="valid_json")
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 regression case"):
        call_command("policyregressions", "reg-cli", stdout=out, stderr=io.StringIO())
    assert "the run before: 1 of 1 (100%)" in out.getvalue()
    assert list(RegressionRun.objects.values_list("draft", "passed", "total")) == [
        (False, 1, 2),
        (False, 1, 1),
    ]
    with pytest.raises(CommandError, match="no output policy"):
        call_command("policyregressions", "nope", stdout=io.StringIO())
