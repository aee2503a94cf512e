"""Reading the environment, one variable a call, typed: a malformed value stops start-up naming
the variable. project/settings.py makes every call (with the variable's name written out, so the
layout check and tests/test_configuration.py can count them); nothing else reads the environment."""

import os
import re

from django.core.exceptions import ImproperlyConfigured


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false)")


def number(name: str, value: str, kind: type[int] | type[float], minimum: float = 0):
    """`value` as an int or float of at least `minimum`; else start-up stops naming `name`."""
    try:
        parsed = kind(value)
    except ValueError:
        article = "an integer" if kind is int else "a number"
        raise ImproperlyConfigured(f"{name}={value!r} is not {article}") from None
    if parsed < minimum:
        raise ImproperlyConfigured(f"{name}={value!r} must be at least {minimum}")
    return parsed


def envint(name: str, default: int, minimum: int = 0) -> int:
    value = os.environ.get(name)
    return default if not value else number(name, value, int, minimum)


def envfloat(name: str, default: float, minimum: float = 0) -> float:
    value = os.environ.get(name)
    return default if not value else number(name, value, float, minimum)


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


def envspec(name: str, defaults: dict[str, str]) -> dict[str, str]:
    """`key=value,key=value` over `defaults`: one variable for a family of knobs, each key
    optional; an unknown key or an item without `=` stops start-up."""
    spec = dict(defaults)
    for item in envlist(name, ""):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in defaults:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not one of {', '.join(f'{k}=...' for k in defaults)}"
            )
        spec[key] = value.strip()
    return spec


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def rate(name: str, value: str) -> tuple[int, float]:
    """`30/1m` (or `30/m`): at most 30 in any minute, as (count, window seconds); `0`: no limit.
    Units s, m, h, d."""
    if value.strip() == "0":
        return 0, 60.0
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*", value)
    if not match:
        raise ImproperlyConfigured(f"{name}={value!r}: write a limit as count/span, e.g. 30/1m")
    count, span, unit = match.groups()
    return int(count), float(int(span or 1) * UNITS[unit])
