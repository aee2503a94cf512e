"""The policy form's hooks and examples editors: inputs built from each hook's signature, the
same JSON saved as before, and typed mistakes refused in words."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Literal

import pytest
from django.contrib.auth.models import User
from django.test import Client

from chat.models import OutputPolicy
from chat.policy import ModerationHook
from chat.policy.hook_params import Param, hook_params, settings_errors
from chat.policy.moderation import ALLOWED, BlocklistHook, RepetitionHook

pytestmark = pytest.mark.unit


class ToneHook(ModerationHook):
    """A hook as a deployment would add one: keyword-only, annotated, with defaults."""

    def __init__(
        self,
        *,
        threshold: float = 0.5,
        categories: list[str] | None = None,
        action: Literal["mask", "block"] = "block",
        fail_open: bool = True,
        timeout_ms: int = 500,
        url: str = "",
    ) -> None:
        self.threshold = threshold

    def check(self, text, *, final):
        return ALLOWED


def test_a_hooks_settings_come_from_its_signature():
    assert hook_params(ToneHook) == [
        Param("threshold", "float", 0.5),
        Param("categories", "json", None),
        Param("action", "choice", "block", ("mask", "block")),
        Param("fail_open", "bool", True),
        Param("timeout_ms", "int", 500),
        Param("url", "str", ""),
    ]
    assert [(p.name, p.kind, p.default) for p in hook_params(RepetitionHook)] == [
        ("max_chars", "int", 4000),
        ("max_repeats", "int", 4),
        ("min_span", "int", 20),
        ("turn_markers", "lines", ["\nUser:", "\nuser:", "<|im_start|>"]),
    ]
    assert [p.kind for p in hook_params(BlocklistHook)] == ["lines", "lines"]


def test_typed_values_parse_or_say_why_not():
    threshold, _, action, _, timeout, _ = hook_params(ToneHook)
    assert threshold.parse("0.25") == 0.25 and timeout.parse(" 40 ") == 40
    with pytest.raises(ValueError, match="timeout_ms must be a whole number, not 'soon'"):
        timeout.parse("soon")
    with pytest.raises(ValueError, match="action must be one of mask, block"):
        action.parse("shout")
    assert settings_errors(ToneHook, {"timeout_ms": "soon", "colour": 1, "fail_open": False}) == [
        "unknown setting 'colour'",
        "timeout_ms must be a whole number, not 'soon'",
    ]
    assert settings_errors(ToneHook, {"threshold": 1, "action": "mask"}) == []
    assert settings_errors(ToneHook, {"timeout_ms": True}) == [
        "timeout_ms must be a int, not true/false"
    ]


class FormValues(HTMLParser):
    """What a browser posts for the page's change form: every named input as it is shown."""

    def __init__(self):
        super().__init__()
        self.data: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None
        self._in_form = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form" and a.get("id") == "outputpolicy_form":
            self._in_form = True
        if not self._in_form:
            return
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button"):
            if a.get("type") == "checkbox":
                if "checked" in a:
                    self.data[name] = a.get("value") or "on"
            else:
                self.data[name] = a.get("value") or ""
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = ""
        elif tag == "select" and name:
            self._select = name
        elif (
            tag == "option" and self._select and ("selected" in a or self._select not in self.data)
        ):
            self.data[self._select] = a.get("value") or ""

    def handle_endtag(self, tag):
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None
        elif tag == "form":
            self._in_form = False

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea] += data.replace("\n", "\r\n")  # as browsers post it


def posted(client, url) -> dict:
    parser = FormValues()
    parser.feed(client.get(url).content.decode())
    parser.data.pop("trial_prompt", None)
    return {**parser.data, "_continue": "1"}


@pytest.fixture
def staff(db):
    client = Client()
    client.force_login(User.objects.create_superuser("staff", "s@example.com", "pw"))
    return client


HOOKS = [
    {"hook": "repetition", "settings": {"max_repeats": 4, "min_span": 12}},
    {"hook": "blocklist", "settings": {"terms": ["darn", "heck"]}},
    {"hook": "repetition"},
]
EXAMPLES = [{"user": "Hi", "assistant": "Hello!\nHow can I help?"}]


def test_saving_the_page_unchanged_keeps_the_same_json_and_version(staff):
    policy = OutputPolicy.objects.create(
        name="p", slug="p", moderation_hooks=HOOKS, examples=EXAMPLES
    )
    url = f"/admin/chat/outputpolicy/{policy.pk}/change/"
    data = posted(staff, url)
    assert "moderation_hooks" not in data and "examples" not in data  # no raw JSON on the page
    assert data["moderation_hooks-1-p-terms"] == "darn\r\nheck"
    assert data["moderation_hooks-0-p-max_chars"] == "4000"
    response = staff.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    policy.refresh_from_db()
    assert policy.moderation_hooks == HOOKS and policy.examples == EXAMPLES
    assert policy.version == 1


def test_hooks_and_examples_are_edited_added_and_removed_as_inputs(staff):
    policy = OutputPolicy.objects.create(
        name="p", slug="p", moderation_hooks=HOOKS, examples=EXAMPLES
    )
    url = f"/admin/chat/outputpolicy/{policy.pk}/change/"
    data = posted(staff, url)
    data["moderation_hooks-0-p-max_repeats"] = "6"
    data["moderation_hooks-2-delete"] = "on"
    data["moderation_hooks-add-blocklist"] = "on"
    data["moderation_hooks-new-blocklist-p-patterns"] = "\\bfoo\\b\r\n"
    data["examples-0-delete"] = "on"
    data["examples-1-user"] = "2+2?"
    data["examples-1-assistant"] = "4"
    assert staff.post(url, data).status_code == 302
    policy.refresh_from_db()
    assert policy.moderation_hooks == [
        {"hook": "repetition", "settings": {"max_repeats": 6, "min_span": 12}},
        {"hook": "blocklist", "settings": {"terms": ["darn", "heck"]}},
        {"hook": "blocklist", "settings": {"patterns": ["\\bfoo\\b"]}},
    ]
    assert policy.examples == [{"user": "2+2?", "assistant": "4"}]
    assert policy.version == 2


def test_a_mistyped_setting_is_refused_on_its_field_and_nothing_changes(staff):
    policy = OutputPolicy.objects.create(name="p", slug="p", moderation_hooks=HOOKS[:1])
    url = f"/admin/chat/outputpolicy/{policy.pk}/change/"
    data = posted(staff, url)
    data["moderation_hooks-0-p-max_repeats"] = "often"
    refused = staff.post(url, data)
    html = refused.content.decode()
    assert refused.status_code == 200
    assert "hook 1 (repetition): max_repeats must be a whole number, not &#x27;often&#x27;" in html
    assert 'value="often"' in html  # what was typed stays in its input
    data["moderation_hooks-0-p-max_repeats"] = "0"
    assert "max_repeats must be a positive integer" in staff.post(url, data).content.decode()
    policy.refresh_from_db()
    assert policy.moderation_hooks == HOOKS[:1] and policy.version == 1


def test_raw_json_is_still_taken_and_an_unloadable_hook_keeps_its_json(staff):
    policy = OutputPolicy.objects.create(
        name="p", slug="p", moderation_hooks=[{"hook": "blocklist", "settings": {"terms": ["x"]}}]
    )
    url = f"/admin/chat/outputpolicy/{policy.pk}/change/"
    data = posted(staff, url)
    for key in [k for k in data if k.startswith("moderation_hooks-")]:
        del data[key]
    data["moderation_hooks"] = '[{"hook": "no.such.Hook"}]'
    html = staff.post(url, data).content.decode()
    assert "cannot load moderation hook" in html  # the policy's own check, as before
    assert "moderation_hooks-0-raw" in html  # shown as its JSON, to fix or remove
