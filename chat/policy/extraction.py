"""Pull one JSON value out of a small model's answer, which rarely is bare JSON."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

__all__ = ["ExtractionError", "extract_json"]

# Small models wrap JSON in a fence, in prose, or both; the closing fence is optional
# because generation may stop at the token limit before writing it.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_JSON_LANGS = ("", "json")
# Bounds the cost of prose full of stray brackets; real answers hit in the first few.
_MAX_CANDIDATES = 32
_CLOSER_AHEAD = re.compile(r"\s*[}\]]")

NO_JSON = "no JSON object or array found in the answer"


class ExtractionError(ValueError):
    """The answer holds no parseable JSON; the message is fit to show or re-ask with."""


def extract_json(text: str) -> object:
    """Return the JSON value in `text`, so callers never parse model output themselves."""
    stripped = text.strip()
    if not stripped:
        raise ExtractionError(NO_JSON)
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    first_error: ExtractionError | None = None
    for fence in _FENCE.finditer(text):
        if fence.group(1).lower() not in _JSON_LANGS:
            continue
        try:
            return _from_region(fence.group(2))
        except ExtractionError as exc:
            first_error = exc
        break  # only the first JSON fence counts; later ones are usually examples
    try:
        return _from_region(text)
    except ExtractionError as exc:
        raise first_error or exc from None


def _from_region(region: str) -> object:
    """Parse a region that is JSON itself or has a JSON object/array inside prose."""
    stripped = region.strip()
    if stripped:
        try:
            return _loads(stripped)
        except ExtractionError:
            pass
    first_error: ExtractionError | None = None
    saw_opener = False
    tried = 0
    for start, char in enumerate(region):
        if char not in "{[":
            continue
        saw_opener = True
        end = _balanced_end(region, start)
        if end is None:
            continue
        try:
            return _loads(region[start:end])
        except ExtractionError as exc:
            first_error = first_error or exc
        tried += 1
        if tried >= _MAX_CANDIDATES:
            break
    if first_error is not None:
        raise first_error
    if saw_opener:
        raise ExtractionError("the JSON in the answer is incomplete (unbalanced brackets)")
    raise ExtractionError(NO_JSON)


def _loads(candidate: str) -> object:
    """Strict parse, then one lenient retry, since trailing commas are a common slip."""
    try:
        return json.loads(candidate)
    except json.JSONDecodeError as exc:
        error = exc
    try:
        return json.loads(_strip_trailing_commas(candidate))
    except json.JSONDecodeError:
        pass
    raise ExtractionError(f"invalid JSON: {error.msg} (line {error.lineno}, column {error.colno})")


def _scan(text: str, start: int = 0) -> Iterator[tuple[int, str, bool]]:
    """Yield (index, char, inside_string) from `start`, tracking JSON string quotes and escapes."""
    in_string = escaped = False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            yield index, char, True
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        else:
            in_string = char == '"'
            yield index, char, in_string


def _balanced_end(text: str, start: int) -> int | None:
    """End index of the bracket span opened at `start`, or None; braces in strings don't count."""
    closers = {"{": "}", "[": "]"}
    stack: list[str] = []
    for index, char, inside in _scan(text, start):
        if inside:
            continue
        if char in closers:
            stack.append(closers[char])
        elif char in "}]":
            if not stack or stack.pop() != char:
                return None
            if not stack:
                return index + 1
    return None


def _strip_trailing_commas(text: str) -> str:
    """Drop commas directly before } or ], leaving string contents untouched."""
    return "".join(
        char
        for index, char, inside in _scan(text)
        if inside or char != "," or not _CLOSER_AHEAD.match(text, index + 1)
    )
