"""The KV of recent rows, keyed by their token ids, so a new row prefills only what is new.

Every turn re-sends the whole conversation, and every conversation of a policy starts with
the same system prompt and few-shot examples. The KV of a token depends only on the tokens
before it (causal attention, positions counted from the row's first token), so the first
L columns of any stored row are exactly what a prefill of the same L ids would compute. A
lookup therefore takes the longest common prefix with *any* entry, not only an entry that
is a whole prefix of the request (the radix-tree idea of SGLang, as a flat list: a handful
of entries, compared in a few vectorised operations).

Only exact token prefixes match, so a changed system prompt, policy or history simply
shares less; the store belongs to one loaded model (backend.LocalBackend), so other weights
never read it, and it empties itself when that model's modules are swapped in place
(quantized or weight-major linears, `use_weights`). Entries are bounded in bytes and leave least-recently-used first. Cancelled
rows are never stored (their KV may stop anywhere mid-prefill).

Forgetting. An entry's ids are someone's words, and whether a prompt reuses them shows in its
speed (and in /metrics), so what a deleted conversation typed must leave too. Each entry
carries the tags (`GenerationRequest.tag`: opaque, the chat's conversation) of every request
whose ids it holds whole, as its prefix or all of it: the row that stored it, a row that found
it already held (`put` adds its tag), a longer row that replaced it (the tags carry over), the
newcomers a shared prefix was computed for. `forget(tags)` drops every entry carrying one of
them. Why this rule and not a guess from the ids: any entry that survives holds only ids that a
request of another, living tag sent whole, so nothing is left that the forgotten conversation
alone typed; entries that merely begin the same way (a policy's system prompt) survive, and
the store does not need the conversation's messages, which are gone by then. A row still
running when its tag is forgotten would store it again; tags forgotten lately are refused.

A lock guards it, though in the server only the generation worker uses it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class PrefixEntry:
    """One stored row: its ids and, per layer, keys and values as [1, heads, len(ids), dim];
    the tags of the requests whose ids it holds whole."""

    ids: torch.Tensor  # 1-D long, on the CPU
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    tags: set[str] = field(default_factory=set)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys, self.values)

    def common(self, ids: torch.Tensor, limit: int) -> int:
        """How many leading ids (at most `limit`) this entry shares with `ids`."""
        return common_prefix(self.ids, ids, limit)


def _nbytes(keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in (*keys, *values))


def common_prefix(a: torch.Tensor, b: torch.Tensor, limit: int) -> int:
    """How many leading ids (at most `limit`) the 1-D tensors `a` and `b` share."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if differ.numel() else n


class PrefixStore:
    """Least-recently-used KV entries within `max_bytes`; counts prefill tokens computed and reused.

    Args:
        max_bytes: the entries' KV bytes together; 0 turns reuse off (nothing is kept).
    """

    # Tags forgotten lately, refused by `put`: far more than the rows that can be running.
    remember_forgotten = 4096

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, max_bytes)
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._numbers = 0
        self._lock = threading.Lock()
        self.nbytes = 0
        # Prompt tokens the model ran, and those taken from here instead (for /metrics).
        self.computed_tokens = 0
        self.reused_tokens = 0
        self.evictions = 0
        self.forgotten = 0  # entries dropped by `forget`
        self._weights: object = None  # what `use_weights` was last told
        self._forgotten_tags: set[str] = set()
        self._forgotten_order: deque[str] = deque()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: list[int], limit: int) -> tuple[int, PrefixEntry | None]:
        """The entry sharing the most leading ids with `ids` (at most `limit`), and how many.

        Marks it recently used. (0, None) when nothing matches.
        """
        if not self._entries or limit <= 0:
            return 0, None
        wanted = torch.tensor(ids, dtype=torch.long)
        with self._lock:
            best, found = 0, None
            for entry in self._entries.values():
                shared = entry.common(wanted, limit)
                if shared > best:
                    best, found = shared, entry
            if found is not None:
                self._touch(found)
            return best, found

    def put(
        self,
        ids: list[int],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        tags: Iterable[str] = (),
    ) -> bool:
        """Keep copies of one row's KV for `ids`, filed under `tags` (its requests'); False when
        it alone exceeds the budget, is already covered (that entry takes the tags), or has a
        forgotten tag. An entry whose ids are a prefix of these is replaced (it adds nothing)."""
        if not self.enabled or not ids:
            return False
        tagged = {tag for tag in tags if tag}
        if _nbytes(keys, values) > self.max_bytes:
            # Checked before copying: a document's KV is hundreds of MB, and a copy made only to
            # be refused would still raise the process's peak and leave the allocator holding it.
            return False
        wanted = torch.tensor(ids, dtype=torch.long)
        with self._lock:
            if tagged & self._forgotten_tags:
                return False  # a row of a conversation deleted while it ran
            for number, entry in list(self._entries.items()):
                shared = entry.common(wanted, len(ids))
                if shared == len(ids):  # an entry already holds all of it
                    entry.tags |= tagged
                    self._entries.move_to_end(number)
                    return False
                if shared == len(entry.ids):  # this one extends that entry
                    tagged |= entry.tags
                    self._drop(number)
            entry = PrefixEntry(
                wanted,
                [k.detach().clone() for k in keys],
                [v.detach().clone() for v in values],
                tagged,
            )
            self._numbers += 1
            self._entries[self._numbers] = entry
            self.nbytes += entry.nbytes
            while self.nbytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
                self.evictions += 1
            return True

    def use_weights(self, weights: object) -> None:
        """The KV about to be read or written is computed with `weights` (any comparable key);
        a different key from last time empties the store: its KV came from other weights."""
        with self._lock:
            if weights != self._weights:
                self._entries.clear()
                self.nbytes = 0
                self._weights = weights

    def forget(self, tags: Iterable[str]) -> int:
        """Drop every entry filed under one of `tags`, and refuse them from now on; how many
        entries went."""
        gone = {tag for tag in tags if tag}
        if not gone:
            return 0
        with self._lock:
            for tag in gone - self._forgotten_tags:
                self._forgotten_tags.add(tag)
                self._forgotten_order.append(tag)
            while len(self._forgotten_order) > self.remember_forgotten:
                self._forgotten_tags.discard(self._forgotten_order.popleft())
            dropped = [number for number, entry in self._entries.items() if entry.tags & gone]
            for number in dropped:
                self._drop(number)
            self.forgotten += len(dropped)
            return len(dropped)

    def clear(self) -> None:
        """Forget every entry (e.g. after the weights changed under the same backend)."""
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def count(self, *, computed: int, reused: int) -> None:
        with self._lock:
            self.computed_tokens += computed
            self.reused_tokens += reused

    def _touch(self, found: PrefixEntry) -> None:
        for number, entry in self._entries.items():
            if entry is found:
                self._entries.move_to_end(number)
                return

    def _drop(self, number: int) -> None:
        entry = self._entries.pop(number)
        self.nbytes -= entry.nbytes
