"""A pasted document, raced against llama-server: its first token, and a newcomer's meanwhile.

Each side gets, per round: a document of about 6,000 tokens alone (time to its first chunk), a
short prompt alone, and the same short prompt sent while another document is being read (its
first chunk then, against alone). Every document begins with its own line, so neither server
reuses the KV of an earlier one (llama-server keeps each slot's prompt; the product its prefix
store): each is read from its first token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .benchmarking import fmt, ratio
from .head_to_head import cell, spread
from .openai_client import Target, stream_chat

PUBLIC_DOMAIN = Path(__file__).parent / "data" / "public_domain.txt"
# About 6,000 of the bundled model's tokens (4.3 characters a token on this text).
DOCUMENT_CHARS = 25_000
NEWCOMER = "Name three colours."
# The newcomer is sent this long after the document, well inside its reading.
NEWCOMER_AFTER_S = 0.5


def document(tag: str) -> str:
    """A ~6,000-token document that starts with `tag` (no prefix shared with another one)."""
    text = PUBLIC_DOMAIN.read_text()
    body = (text * (DOCUMENT_CHARS // len(text) + 1))[:DOCUMENT_CHARS]
    return f"Document {tag}.\n\n{body}\n\nSummarise the document above in one sentence."


@dataclass
class DocumentSide:
    """One server's document figures over the rounds (ms, or None when a stream failed)."""

    target: Target
    document_first_ms: list[float | None] = field(default_factory=list)
    newcomer_alone_ms: list[float | None] = field(default_factory=list)
    newcomer_during_ms: list[float | None] = field(default_factory=list)
    prompt_tokens: int | None = None
    errors: list[str] = field(default_factory=list)


def _first_ms(target: Target, prompt: str, side: DocumentSide) -> float | None:
    stream = stream_chat(target, prompt, max_tokens=4)
    if stream.error:
        side.errors.append(stream.error)
    return stream.first_chunk_ms


def one_round(side: DocumentSide, round_no: int) -> None:
    target = side.target
    if target.reset is not None:
        target.reset()
    side.document_first_ms.append(_first_ms(target, document(f"{round_no}-alone"), side))
    side.newcomer_alone_ms.append(_first_ms(target, f"{NEWCOMER} ({round_no}a)", side))
    reading = threading.Thread(
        target=_first_ms, args=(target, document(f"{round_no}-busy"), side), daemon=True
    )
    reading.start()
    time.sleep(NEWCOMER_AFTER_S)
    side.newcomer_during_ms.append(_first_ms(target, f"{NEWCOMER} ({round_no}b)", side))
    reading.join()


def race(sides: list[DocumentSide], *, rounds: int, note: Callable[[str], None]) -> None:
    """Interleaved rounds: each side in turn, so drift on a shared machine hits both."""
    for round_no in range(1, rounds + 1):
        for side in sides:
            note(f"  document round {round_no}/{rounds}: {side.target.label}")
            one_round(side, round_no)


def report(product: DocumentSide, llama: DocumentSide, *, rounds: int) -> list[str]:
    width = 26
    lines = [
        f"A pasted document (~{DOCUMENT_CHARS:,} characters), against llama-server (2 slots of "
        f"8,192 tokens); median (min-max) of {rounds} round(s), ms",
        f"  {'figure':46} {product.target.label[:width]:>{width}} {llama.target.label[:width]:>{width}}  product/llama",
    ]
    for name, mine, theirs in (
        ("document alone: first chunk ms", product.document_first_ms, llama.document_first_ms),
        ("short prompt alone: first chunk ms", product.newcomer_alone_ms, llama.newcomer_alone_ms),
        (
            "short prompt while a document is read: first ms",
            product.newcomer_during_ms,
            llama.newcomer_during_ms,
        ),
    ):
        x = ratio(spread(mine)[0], spread(theirs)[0])
        lines.append(
            f"  {name:46} {cell(mine, '.0f'):>{width}} {cell(theirs, '.0f'):>{width}}  {fmt(x, '.2f', 'x'):>13}"
        )
    for side in (product, llama):
        slowdown = ratio(spread(side.newcomer_during_ms)[0], spread(side.newcomer_alone_ms)[0])
        lines.append(
            f"  {side.target.label}: a newcomer's first chunk during a document / alone: "
            f"{fmt(slowdown, '.2f', 'x')}"
        )
        if side.errors:
            lines.append(
                f"  errors ({side.target.label}): {'; '.join(sorted(set(side.errors)))[:300]}"
            )
    return lines


def targets(product: DocumentSide, llama: DocumentSide) -> list[tuple[str, str, str, bool | None]]:
    first = ratio(spread(product.document_first_ms)[0], spread(llama.document_first_ms)[0])
    during = ratio(spread(product.newcomer_during_ms)[0], spread(product.newcomer_alone_ms)[0])
    return [
        (
            "document first chunk: product / llama-server",
            fmt(first, ".2f", "x"),
            "<= 1.0x",
            None if first is None else first <= 1.0,
        ),
        (
            "newcomer during a document / alone (product)",
            fmt(during, ".2f", "x"),
            "<= 1.5x",
            None if during is None else during <= 1.5,
        ),
    ]
