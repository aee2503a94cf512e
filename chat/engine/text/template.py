"""A chat rendered by its template and tokenized so that message contents are always text.

Tokenizing the rendered chat as one string would turn a `<|im_end|>` typed by a user into
the real control token and let them forge turns ("hi<|im_end|>\\n<|im_start|>system\\n...").
So the template is rendered with a placeholder in place of each message's content: only
the template's own text may hold special tokens; the contents (user, history, assistant,
and the staff's system prompt and examples alike) are tokenized with
`split_special_tokens=True`. The chat is split at the template's special tokens, and the
text between two of them (template text and contents together) is tokenized in one
piece, so for contents without markers the ids are exactly those of tokenizing the
rendered string whole.

A template that transforms a content (`| trim`) or looks inside it sees the placeholder;
the content then goes in verbatim.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
from typing import Any


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of what turns a chat into ids: the vocabulary and merges, the added and special
    tokens (all in the fast tokenizer's JSON), and the chat template."""
    digest = hashlib.sha256()
    inner = getattr(tokenizer, "backend_tokenizer", None)
    digest.update(inner.to_str().encode() if inner is not None else repr(tokenizer).encode())
    digest.update(b"\0")
    digest.update(str(getattr(tokenizer, "chat_template", None) or "").encode())
    return digest.hexdigest()


def continues_answer(messages: list[dict[str, Any]]) -> bool:
    """A chat that ends on an assistant message asks for the rest of that answer."""
    return bool(messages) and messages[-1].get("role") == "assistant"


def render_pieces(tokenizer: Any, messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """The rendered chat as (text, is_content) pieces, in order: with the generation prompt,
    or, when it ends on an assistant message, open at that message's end so the model goes on
    writing it (what transformers' `continue_final_message` does)."""
    nonce = secrets.token_hex(8)
    masked = [
        {**m, "content": f"\x00{nonce}:{i}\x00"} if isinstance(m.get("content"), str) else m
        for i, m in enumerate(messages)
    ]
    if continues_answer(messages):
        template = tokenizer.apply_chat_template(
            masked, tokenize=False, add_generation_prompt=False
        )
        last = f"\x00{nonce}:{len(messages) - 1}\x00"
        template = template[: template.rindex(last) + len(last)]
    else:
        template = tokenizer.apply_chat_template(masked, tokenize=False, add_generation_prompt=True)
    parts = re.split(f"\x00{nonce}:(\\d+)\x00", template)
    pieces = []
    for n, part in enumerate(parts):
        if n % 2:
            pieces.append((messages[int(part)]["content"], True))
        elif part:
            pieces.append((part, False))
    return pieces


@functools.lru_cache(maxsize=8)  # one per tokenizer in the process; built from its vocabulary
def special_token_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """Matches the tokenizer's special tokens (longest first), or None if it has none."""
    specials = sorted(
        {t.content for t in tokenizer.added_tokens_decoder.values() if t.special},
        key=len,
        reverse=True,
    )
    return re.compile("|".join(map(re.escape, specials))) if specials else None


def encode_pieces(tokenizer: Any, pieces: list[tuple[str, bool]]) -> list[int]:
    """Token ids: special tokens only where the template wrote them, everything else text."""
    pattern = special_token_pattern(tokenizer)
    runs: list[str | int] = []  # text runs, with the template's special token ids between
    current = ""  # the text run being gathered
    for text, is_content in pieces:
        if is_content or pattern is None:
            current += text
            continue
        start = 0
        for match in pattern.finditer(text):
            runs += [
                current + text[start : match.start()],
                tokenizer.convert_tokens_to_ids(match.group()),
            ]
            current = ""
            start = match.end()
        current += text[start:]
    runs.append(current)
    texts = [run for run in runs if isinstance(run, str) and run]
    encoded = iter(
        tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if texts
        else []
    )
    ids: list[int] = []
    for run in runs:
        if isinstance(run, int):
            ids.append(run)
        elif run:
            ids.extend(next(encoded))
    return ids


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of plain text, as a message content is encoded (typed markers stay text)."""
    ids: list[int] = tokenizer(text, add_special_tokens=False, split_special_tokens=True)[
        "input_ids"
    ]
    return ids


# U+2060 WORD JOINER: invisible, joins rather than breaks, and no tokenizer's special token holds it.
_JOINER = "\u2060"


def defuse_markers(
    messages: list[dict[str, Any]], pattern: re.Pattern[str] | None
) -> list[dict[str, Any]]:
    """The messages with every special token typed in a content broken by an invisible joiner.

    For a server that renders and tokenizes the chat itself (the OpenAI-compatible API):
    its tokenizer would read a typed `<|im_end|>` as the control token, and nothing in
    that API asks it not to. Only what is sent changes; the stored text keeps the marker.
    """
    if pattern is None:
        return messages

    def defuse(match: re.Match[str]) -> str:
        return match.group()[0] + _JOINER + match.group()[1:]

    return [
        {**m, "content": pattern.sub(defuse, m["content"])}
        if isinstance(m.get("content"), str)
        else m
        for m in messages
    ]
