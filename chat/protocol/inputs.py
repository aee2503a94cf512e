"""The input edge: what every transport does to a request before anything else reads it.

The socket (chat/protocol/__init__.py), the HTTP chat (chat/transports/api.py), the OpenAI API
(chat/transports/openai/parsing.py's json_body) and the page's own endpoints
(chat/pages/chat_page.py, chat/accounts/api_keys_page.py) each call one function here, so a body's size, its JSON, the strings it carries and the ids it
names are checked the same way whichever door it came in by (docs/security.md, "The input
edge"). Each raises InputError; the transport turns it into its own error shape.

Text with a lone surrogate or a NUL is refused, never repaired: a lone surrogate ("\\ud800" in
JSON) is not Unicode and no UTF-8 client sends one by accident, PostgreSQL cannot store a NUL,
and a silent repair would change the prompt (and its cache key) behind the sender's back.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from django.core.exceptions import RequestDataTooBig

# Deeper JSON than any request needs (a JSON Schema in response_format is the deepest real
# one), far below the decoder's recursion limit (about 1,000 levels).
MAX_JSON_DEPTH = 64
# Ids are database keys: a positive bigint.
MAX_ID = 2**63 - 1

TOO_LARGE = "frame_too_large"
BAD_JSON = "bad_json"
BAD_TEXT = "bad_text"


class InputError(ValueError):
    """A request refused at the edge. `code` is TOO_LARGE, BAD_JSON or BAD_TEXT; `param` says
    where, as a path into the JSON (`messages[0].content`, `stop[1]`), when it is known.
    TOO_LARGE and BAD_JSON messages read after "the body" or "the frame"; BAD_TEXT ones whole."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        # BAD_TEXT from json_parse: the decoded value, so a transport can still answer with
        # the request's (clean) id.
        self.value = None


def body_read(request: Any, *, limit: int) -> bytes:
    """An HTTP request's body, or InputError TOO_LARGE past `limit` bytes (or past Django's
    DATA_UPLOAD_MAX_MEMORY_SIZE, which would otherwise be its HTML 400 page)."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    try:
        body = b"" if declared > limit else request.body
    except RequestDataTooBig:
        body = None
    if body is None or declared > limit or len(body) > limit:
        raise InputError(TOO_LARGE, f"is over the limit of {limit} bytes")
    return body


# A JSON string (escapes included), so brackets inside strings are not counted as nesting.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(raw: bytes) -> int:
    """How deeply `raw` nests, counted without parsing it (so without recursing): a linear scan
    of its brackets outside strings. Malformed input gives some number; the parser then says
    what is wrong with it."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if len(brackets) <= 2:  # the usual body: one object or list, flat
        return min(len(brackets), 1)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def json_parse(raw: bytes | str, *, limit: int, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A request's JSON value, checked: at most `limit` bytes (characters for a str), nested at
    most `max_depth` deep, and every string in it (object keys too) clean text."""
    if len(raw) > limit:
        raise InputError(TOO_LARGE, f"is over the limit of {limit} bytes")
    # surrogatepass: a socket frame is a str, and may hold a lone surrogate itself.
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    if json_depth(data) > max_depth:
        raise InputError(BAD_JSON, f"is nested too deeply (more than {max_depth} levels)")
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InputError(BAD_JSON, f"is not valid JSON: {exc}") from None
    except RecursionError:  # unreachable past the depth scan; kept as the last line of defence
        raise InputError(BAD_JSON, "is nested too deeply") from None
    try:
        strings_check(value)
    except InputError as exc:
        exc.value = value
        raise
    return value


def text_problem(text: str) -> str | None:
    """Why `text` cannot be taken (a lone surrogate, a NUL), or None when it can."""
    if "\x00" in text:
        return "holds a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode: it holds a lone surrogate (such as \\ud800 in the JSON)"
    return None


def text_check(text: str, param: str | None = None) -> str:
    """`text` itself, or InputError BAD_TEXT saying what is wrong with it."""
    problem = text_problem(text)
    if problem:
        raise InputError(BAD_TEXT, f"{param or 'the text'} {problem}", param)
    return text


def strings_check(value: Any, path: str = "") -> None:
    """Every string in a decoded JSON value, keys included, is clean text (InputError otherwise).
    Recursion is bounded by the depth check json_parse made first."""
    if isinstance(value, str):
        text_check(value, path or None)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            strings_check(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if text_problem(key):
                # The key itself is the bad string: name its parent, and the key escaped.
                raise InputError(
                    BAD_TEXT, f"a key {ascii(key)[:60]} {text_problem(key)}", path or None
                )
            strings_check(item, where)


def id_parse(value: Any) -> int | None:
    """A database id from a query parameter, a form field or a JSON number, or None.

    ASCII digits only: str.isdigit() also takes "²" and "٣", which int() then refuses or
    reads as another number. Bounded by the bigint a key is, so the database never sees
    a number it cannot compare.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit()) or len(value) > 19:
            return None
        value = int(value)
    if not isinstance(value, int) or not 1 <= value <= MAX_ID:
        return None
    return value
