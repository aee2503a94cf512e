"""The policy form's editors for its two JSON lists: moderation hooks and few-shot examples,
edited as rows of inputs instead of raw JSON, saving the same JSON as before.

A hook's inputs come from its class's keyword parameters (chat/policy/hook_params.py), so a new
hook in `chat.policy.moderation.HOOKS` gets its editor with no change here. A post that still
carries the raw JSON under the field's own name (scripts, older tests) is taken as it is.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from ..policy.hook_params import Param, hook_class, hook_params
from ..policy.hook_params import settings_errors as hook_settings_errors
from ..policy.moderation import HOOKS, HookConfigError, load_hook


def _parsed(value: Any) -> Any:
    """The field's value as a Python list, or the text it was (unparseable JSON)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _shown(param: Param, value: Any) -> Any:
    """A setting's value as its input shows it."""
    if param.kind == "lines" and isinstance(value, list):
        return "\n".join(str(v) for v in value)
    if param.kind == "json":
        return "" if value is None else json.dumps(value)
    return value


def _typed(param: Param, raw: Any) -> Any:
    """A typed-in value; left as typed when it does not parse, for the field to refuse in words."""
    try:
        return param.parse(raw)
    except ValueError:
        return raw


def _one_a_line(value: Any) -> bool:
    """Whether a list of strings survives being typed one a line ("\nUser:" does not)."""
    return isinstance(value, list) and all(
        isinstance(v, str) and v and v == v.strip() and "\n" not in v for v in value
    )


def _inputs(params: list[Param], values: dict, prefix: str) -> list[dict]:
    inputs = []
    for p in params:
        value = values.get(p.name, p.default)
        kind = p.kind
        if kind == "lines" and not (_one_a_line(value) and _one_a_line(p.default or [])):
            kind = "json"  # the list as JSON, so every string keeps its exact characters
        inputs.append(
            {
                "name": p.name,
                "kind": kind,
                "input": f"{prefix}-p-{p.name}",
                "value": json.dumps(value) if kind != p.kind else _shown(p, value),
                "as_json": kind != p.kind,
                "choices": [str(c) for c in p.choices],
            }
        )
    return inputs


def _summary(cls: type) -> str:
    return (cls.__doc__ or "").strip().split("\n")[0]


class JsonRowsWidget(forms.Widget):
    """Shared by both editors: the raw JSON under the field's name wins when it was posted."""

    template_name = ""

    def render(self, name, value, attrs=None, renderer=None):
        return mark_safe(render_to_string(self.template_name, self.get_context(name, value, attrs)))

    def value_omitted_from_data(self, data, files, name):
        return name not in data and f"{name}-count" not in data

    def value_from_datadict(self, data, files, name):
        if name in data:
            return data[name]
        if f"{name}-count" not in data:
            return None
        try:
            count = max(0, min(int(data[f"{name}-count"]), 1000))
        except ValueError:
            count = 0
        return json.dumps(self.rows_from(data, name, count))

    def rows_from(self, data, name: str, count: int) -> list:
        raise NotImplementedError


class HooksWidget(JsonRowsWidget):
    template_name = "admin/chat/widgets/hooks.html"

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        entries = _parsed(value if value is not None else "[]")
        rows: list[dict] = []
        raw = None
        if not isinstance(entries, list):
            raw = value if isinstance(value, str) else json.dumps(entries)
            entries = []
        for index, entry in enumerate(entries):
            prefix = f"{name}-{index}"
            hook = entry.get("hook") if isinstance(entry, dict) else None
            cls = hook_class(hook) if isinstance(hook, str) else None
            settings = entry.get("settings") if isinstance(entry, dict) else None
            if cls is None or not isinstance(settings, (dict, type(None))):
                rows.append({"prefix": prefix, "raw": json.dumps(entry), "hook": hook})
                continue
            settings = settings or {}
            rows.append(
                {
                    "prefix": prefix,
                    "hook": hook,
                    "summary": _summary(cls),
                    "bare": "settings" not in entry,
                    "set": ",".join(settings),
                    "params": _inputs(hook_params(cls), settings, prefix),
                }
            )
        addable = []
        for short in HOOKS:
            cls = hook_class(short)
            if cls is not None:
                prefix = f"{name}-new-{short}"
                addable.append(
                    {
                        "hook": short,
                        "summary": _summary(cls),
                        "add": f"{name}-add-{short}",
                        "params": _inputs(hook_params(cls), {}, prefix),
                    }
                )
        context.update(name=name, rows=rows, count=len(rows), raw=raw, addable=addable)
        return context

    def rows_from(self, data, name: str, count: int) -> list:
        entries: list = []
        for index in range(count):
            prefix = f"{name}-{index}"
            if f"{prefix}-delete" in data:
                continue
            if f"{prefix}-raw" in data:  # a hook this editor cannot read: its JSON as typed
                entries.append(_parsed(data[f"{prefix}-raw"]))
                continue
            hook = data.get(f"{prefix}-hook", "")
            kept = {s for s in data.get(f"{prefix}-set", "").split(",") if s}
            entry = self._entry(data, hook, prefix, kept)
            if entry.get("settings") == {} and data.get(f"{prefix}-bare") == "1":
                entry.pop("settings")
            entries.append(entry)
        for short in HOOKS:
            if f"{name}-add-{short}" in data:
                entries.append(self._entry(data, short, f"{name}-new-{short}", set()))
        return entries

    @staticmethod
    def _entry(data, hook: str, prefix: str, kept: set[str]) -> dict:
        """One hook's JSON: the settings that differ from their defaults, and those the stored
        entry already named (so an unchanged policy saves the same JSON and keeps its version)."""
        cls = hook_class(hook)
        if cls is None:
            return {"hook": hook, "settings": {}}
        settings = {}
        for param in hook_params(cls):
            key = f"{prefix}-p-{param.name}"
            if param.kind == "bool":
                value = key in data
            elif key in data and data.get(f"{key}-as") == "json":
                value = _typed(replace(param, kind="json"), data[key])
            elif key in data:
                value = _typed(param, data[key])
            else:
                continue
            if value != param.default or param.name in kept:
                settings[param.name] = value
        return {"hook": hook, "settings": settings}


def _reach_problems(hook: str, settings: dict) -> list[str]:
    """What the hook would call or send that the operator does not allow (CHAT_HOOKS)."""
    try:
        return load_hook(hook, settings).reach_problems()
    except HookConfigError:
        return []  # the policy's own check says what is wrong with the settings


class HooksField(forms.JSONField):
    """The policy's moderation hooks; each known hook's settings checked against its signature,
    and what it would reach against what the operator allows."""

    widget = HooksWidget

    def to_python(self, value):
        converted = super().to_python(value)
        return [] if converted is None else converted

    def validate(self, value):
        super().validate(value)
        if not isinstance(value, list):
            return  # the policy's own check says what the list must look like
        problems = []
        for index, entry in enumerate(value):
            hook = entry.get("hook") if isinstance(entry, dict) else None
            cls = hook_class(hook) if isinstance(hook, str) else None
            settings = entry.get("settings") if isinstance(entry, dict) else None
            if cls is None or not isinstance(settings, (dict, type(None))):
                continue  # unknown hooks and odd shapes: the policy's check names them
            typed = hook_settings_errors(cls, settings or {})
            for problem in typed or _reach_problems(hook, settings or {}):
                problems.append(f"hook {index + 1} ({hook}): {problem}")
        if problems:
            raise ValidationError(problems)


class ExamplesWidget(JsonRowsWidget):
    template_name = "admin/chat/widgets/examples.html"
    blank_rows = 2

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        pairs = _parsed(value if value is not None else "[]")
        raw = None
        if not isinstance(pairs, list) or not all(isinstance(p, dict) for p in pairs):
            raw, pairs = (value if isinstance(value, str) else json.dumps(pairs)), []
        rows = [
            {
                "prefix": f"{name}-{i}",
                "user": p.get("user", ""),
                "assistant": p.get("assistant", ""),
            }
            for i, p in enumerate(pairs)
        ]
        rows += [
            {"prefix": f"{name}-{i}", "user": "", "assistant": "", "blank": True}
            for i in range(len(rows), len(rows) + self.blank_rows)
        ]
        context.update(name=name, rows=rows, count=len(rows), raw=raw)
        return context

    def rows_from(self, data, name: str, count: int) -> list:
        pairs = []
        for index in range(count):
            prefix = f"{name}-{index}"
            # Browsers post a textarea's line breaks as CRLF; the stored JSON has always had LF.
            user = data.get(f"{prefix}-user", "").replace("\r\n", "\n")
            assistant = data.get(f"{prefix}-assistant", "").replace("\r\n", "\n")
            if f"{prefix}-delete" in data or not (user.strip() or assistant.strip()):
                continue
            pairs.append({"user": user, "assistant": assistant})
        return pairs


class ExamplesField(forms.JSONField):
    widget = ExamplesWidget

    def to_python(self, value):
        converted = super().to_python(value)
        return [] if converted is None else converted
