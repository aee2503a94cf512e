"""One corpus of hostile request bodies, run through every transport (tests/test_hostile.py):
the socket's frames, `/api`'s bodies and `/v1`'s, each a valid request with one string or id
replaced by something hostile, plus whole bodies no transport may choke on.

Every body here is refused before generation, so running the corpus costs no model time.
"""

from __future__ import annotations

import json

# Strings no request may carry: not Unicode (a lone surrogate is valid JSON, "\\ud800"), or
# unstorable (PostgreSQL refuses NUL). The deep value is written into the JSON raw.
DEEP = "[" * 5000 + "]" * 5000
BAD_STRINGS = {
    "lone high surrogate": "hi \ud800",
    "lone low surrogate": "\udc00",
    "NUL": "hi \x00 there",
}
# What an id field (a database key) may be sent instead of a positive integer.
BAD_IDS = {
    "superscript two": "²",
    "Arabic-Indic three": "٣",
    "fullwidth twelve": "１２",
    "digits as a string": "7",
    "past a bigint": 10**30,
    "zero": 0,
    "negative": -1,
    "boolean": True,
    "float": 1.5,
    "object": {"id": 1},
}
# Whole bodies, whatever the transport.
RAW_BODIES = {
    "nested 5,000 deep": DEEP,
    "100,000 unclosed [": "[" * 100_000,
    "objects nested 5,000 deep": '{"a":' * 5000 + "1" + "}" * 5000,
    "10 MB": json.dumps({"text": "x" * 10_000_000}),
    "a list": "[]",
    "a number": "1",
    "null": "null",
    "not JSON": "hi",
    "empty": "",
    "a key with a lone surrogate": '{"\\ud800": 1}',
}


def _set(body: dict, path: tuple, value) -> dict:
    body = json.loads(json.dumps(body))  # a deep copy
    target = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return body


def encode(body) -> str:
    """JSON text; a lone surrogate is written as its \\u escape, DEEP raw in place of its marker."""
    return json.dumps(body).replace(json.dumps(_DEEP_MARK), DEEP)


_DEEP_MARK = "<deep value>"


def corpus(valid: dict, strings: list[tuple], ids: list[tuple]) -> list[tuple[str, str]]:
    """(what, body) for each hostile variant of the `valid` body: every bad string and a deep
    value at each path in `strings`, every bad id at each path in `ids`, every raw body."""
    variants = []
    for path in strings:
        for name, text in BAD_STRINGS.items():
            variants.append((f"{name} in {path}", encode(_set(valid, path, text))))
        variants.append((f"a deep value in {path}", encode(_set(valid, path, _DEEP_MARK))))
        variants.append((f"a number in {path}", encode(_set(valid, path, 12))))
    for path in ids:
        for name, value in BAD_IDS.items():
            variants.append((f"{name} as {path}", encode(_set(valid, path, value))))
    variants += [(name, raw) for name, raw in RAW_BODIES.items()]
    return variants


# The socket's frame: every string and id it carries.
FRAME = {
    "type": "prompt",
    "request_id": "h1",
    "text": "hi",
    "conversation": 1,
    "policy": "chat",
    "replace": 1,
}
_SOCKET_CORPUS = (
    corpus(
        FRAME,
        strings=[("type",), ("request_id",), ("text",), ("policy",)],
        ids=[("conversation",), ("replace",)],
    )
    + corpus(
        {"type": "cancel", "request_id": "h2", "message": 1},
        strings=[("request_id",)],
        ids=[("message",)],
    )[: -len(RAW_BODIES)]
)
# (The test communicator cannot send an empty frame; a real one gets bad_json like any other.)
SOCKET_CORPUS = [(what, frame) for what, frame in _SOCKET_CORPUS if frame]

# `/api/chat`'s body: the frame, type and request_id optional.
API_CORPUS = corpus(
    {k: v for k, v in FRAME.items() if k != "type"},
    strings=[("request_id",), ("text",), ("policy",)],
    ids=[("conversation",), ("replace",)],
)
API_CANCEL_CORPUS = [
    (f"{name} as message", encode({"message": value})) for name, value in BAD_IDS.items()
] + [(name, raw) for name, raw in RAW_BODIES.items()]

# `/v1/chat/completions`: system, history, text parts, stop, the model and policy names, the
# schema's name; the numbers a client sends (n, max_tokens, seed) stand in for ids.
V1_BODY = {
    "model": "smollm2",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
    ],
    "stop": ["\n\n"],
    "policy": "chat",
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}},
    },
    "max_tokens": 5,
    "n": 1,
    "seed": 1,
}
V1_CORPUS = corpus(
    V1_BODY,
    strings=[
        ("model",),
        ("messages", 0, "content"),
        ("messages", 1, "content"),
        ("messages", 2, "content"),
        ("messages", 3, "content", 0, "text"),
        ("messages", 1, "role"),
        ("stop", 0),
        ("stop",),
        ("policy",),
        ("response_format", "json_schema", "name"),
    ],
    ids=[("max_tokens",), ("n",), ("seed",)],
)
# The variants that are valid requests all the same: a seed may be any integer, and a
# max_tokens past the cap is the cap (docs/openai-api.md).
V1_SERVED = {
    "past a bigint as ('max_tokens',)",
    "past a bigint as ('seed',)",
    "zero as ('seed',)",
    "negative as ('seed',)",
}
