"""What settings a moderation hook takes, read from its keyword-only `__init__` parameters and
their annotations, so an editor can offer a field per setting for any hook, a new one included.

Pure stdlib: the admin's form (chat/admin/policy_fields.py) builds its inputs from these.
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import json
import typing
from dataclasses import dataclass
from typing import Any

from .moderation import HOOKS, ModerationHook

# How a setting is typed in: one input kind per annotation.
KINDS = ("bool", "int", "float", "str", "choice", "lines", "json")
_SEQUENCES = {
    list,
    tuple,
    collections.abc.Iterable,
    collections.abc.Sequence,
    collections.abc.Collection,
}


@dataclass(frozen=True)
class Param:
    """One setting: its name, input kind, default (as JSON has it) and choices (for `choice`)."""

    name: str
    kind: str
    default: Any
    choices: tuple[Any, ...] = ()

    def parse(self, raw: Any) -> Any:
        """A typed-in value as the setting's JSON value; ValueError in words staff can act on."""
        if self.kind == "bool":
            return bool(raw)
        text = str(raw).strip() if raw is not None else ""
        if self.kind == "int":
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"{self.name} must be a whole number, not {text!r}") from None
        if self.kind == "float":
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"{self.name} must be a number, not {text!r}") from None
        if self.kind == "lines":
            return [line.strip() for line in str(raw or "").splitlines() if line.strip()]
        if self.kind == "json":
            try:
                return json.loads(text) if text else None
            except json.JSONDecodeError as exc:
                raise ValueError(f"{self.name} must be JSON: {exc}") from None
        if self.kind == "choice" and text not in {str(c) for c in self.choices}:
            raise ValueError(f"{self.name} must be one of {', '.join(map(str, self.choices))}")
        return text

    def check(self, value: Any) -> str | None:
        """What is wrong with a stored value's type, or None."""
        expected = {
            "bool": (bool,),
            "int": (int,),
            "float": (int, float),
            "str": (str,),
            "choice": (str, int),
        }.get(self.kind)
        if self.kind == "lines":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return f"{self.name} must be a list of strings"
            return None
        if expected is None:
            return None
        if isinstance(value, bool) and self.kind != "bool":
            return f"{self.name} must be a {self.kind}, not true/false"
        if not isinstance(value, expected):
            words = {"int": "whole number", "float": "number", "choice": "choice", "str": "text"}
            return f"{self.name} must be a {words.get(self.kind, self.kind)}, not {value!r}"
        if self.kind == "choice" and value not in self.choices:
            return f"{self.name} must be one of {', '.join(map(str, self.choices))}"
        return None


def _kind(annotation: Any) -> tuple[str, tuple[Any, ...]]:
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return "bool", ()
    if annotation is int:
        return "int", ()
    if annotation is float:
        return "float", ()
    if annotation is str:
        return "str", ()
    if origin is typing.Literal:
        return "choice", typing.get_args(annotation)
    if origin in _SEQUENCES and all(a in (str, Ellipsis) for a in typing.get_args(annotation)):
        return "lines", ()
    return "json", ()


def _plain(value: Any) -> Any:
    """A default as JSON would store it: tuples as lists."""
    return list(value) if isinstance(value, (tuple, frozenset, set)) else value


def hook_class(name_or_path: str) -> type[ModerationHook] | None:
    """The class for a short name or dotted path, or None when it cannot be loaded."""
    path = HOOKS.get(name_or_path, name_or_path)
    module_name, _, attr = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr) if module_name else None
    except (ImportError, AttributeError, ValueError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, ModerationHook) else None


def hook_params(cls: type) -> list[Param]:
    """The keyword settings of a hook class, in their declared order."""
    init = vars(cls).get("__init__") or next(
        vars(base)["__init__"] for base in cls.__mro__ if "__init__" in vars(base)
    )
    hints = typing.get_type_hints(init)
    params = []
    for parameter in inspect.signature(init).parameters.values():
        if parameter.name == "self" or parameter.kind not in (
            parameter.KEYWORD_ONLY,
            parameter.POSITIONAL_OR_KEYWORD,
        ):
            continue
        kind, choices = _kind(hints.get(parameter.name, Any))
        default = None if parameter.default is parameter.empty else _plain(parameter.default)
        params.append(Param(parameter.name, kind, default, choices))
    return params


def settings_errors(cls: type, settings: dict[str, Any]) -> list[str]:
    """Settings a hook does not take, or of the wrong type, in words staff can act on."""
    params = {p.name: p for p in hook_params(cls)}
    problems = [f"unknown setting {name!r}" for name in settings if name not in params]
    for name, value in settings.items():
        if name in params:
            problem = params[name].check(value)
            if problem:
                problems.append(problem)
    return problems


def changed_settings(params: list[Param], values: dict[str, Any]) -> dict[str, Any]:
    """Only the settings that differ from their defaults: what the stored JSON holds today."""
    return {
        p.name: values[p.name] for p in params if p.name in values and values[p.name] != p.default
    }
