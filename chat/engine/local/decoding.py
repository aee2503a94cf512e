"""Iteration-level (continuous) batching: rows join and leave a running batch between decode steps.

The way TGI's `CausalLMBatch` does it, on a transformers `DynamicCache` that appends in place
(kv_cache.py): newcomers are
prefilled together (left-padded), their caches are padded to the running batch's width
and concatenated onto it, and each step feeds every row its last token with its own
position id. A row that ends (eos, stop string, length, cancel) is dropped from the cache
at once (`batch_select_indices`), so it costs nothing afterwards; columns that only held
padding of departed rows are trimmed off the left.

With a prefix store (prefix_store.py), a newcomer takes the KV of the longest prefix of its
ids that a recent row computed, and prefills only the rest: its reused columns are placed
right before its remainder, so every row stays padding-then-tokens with no hole. Newcomers
that arrive together and share a prefix (a policy's system prompt) have it prefilled once.
Each row's prompt KV is stored when it joins, and its whole KV (prompt and answer) when it
ends normally; a cancelled row's never is.

Per row: its own eos ids, stop strings (stopping.py on the ids, the
holdback on the text), max/min_new_tokens, the penalties against loops (penalties.py),
temperature/top_p (transformers' warpers) and a schema's xgrammar logits processor, so
constrained rows run beside prose rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import DynamicCache

from .batching import Row, left_pad
from .choosing import next_tokens
from .chunked_prefill import ChunkedPrefill, row_indices
from .heap import HeapTrimmer
from .kv_cache import GrowingCache
from .llama_step import MAX_TOKENS as MAX_FUSED_TOKENS
from .llama_step import LlamaStep
from .llama_step import prepare as prepare_llama_step
from .pausable_forward import PausableForward, Paused
from .prefix_store import PrefixEntry, PrefixStore, common_prefix
from .stopping import StopStrings
from .threads import ThreadPlan


class RunningBatch:
    """The rows decoding together, with their KV cache; not thread-safe (one worker drives it).

    Args:
        model: a causal LM in eval mode.
        pad_id: token id written into padding positions (masked out).
        stop_criteria: the StopStrings for a tuple of stop strings (built once, cached).
        prefill_chunk: while rows decode, a newcomer's prompt is prefilled this many tokens a step.
        prefix_store: KV of recent rows to reuse and to add to; None prefills every prompt whole.
        threads: torch threads per forward pass by its size (threads.py).
        fused_step: decode steps and short prefills in one C++ call where the model allows it (llama_step.py);
            False keeps transformers' forward for every pass.
    """

    # Newcomers arriving together prefill a prefix they share once, if it is at least this long.
    shared_prefix_min = 16
    # With no row decoding, a pending prompt is read this many chunks at a time.
    CHUNK_ALONE_FACTOR = 2
    # A row that joined and has shown no text yet decodes up to this many tokens before a
    # pending prompt reads on: a newcomer's first words never wait behind a document's chunk.
    FIRST_TOKENS = 8

    def __init__(
        self,
        model,
        pad_id: int,
        stop_criteria: Callable[[tuple[str, ...]], StopStrings],
        *,
        prefill_chunk: int = 0,
        prefix_store: PrefixStore | None = None,
        threads: ThreadPlan | None = None,
        fused_step: bool = True,
        heap: HeapTrimmer | None = None,
    ):
        self.model = model
        self.pad_id = pad_id
        self.stop_criteria = stop_criteria
        self.prefill_chunk = prefill_chunk  # 0: every prefill in one forward pass
        self.store = prefix_store  # None or disabled: nothing reused (still counted when given)
        self.threads = threads  # None: torch's threads as they are, for every pass
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [rows, width], 0 on padding
        self.pending: list[
            ChunkedPrefill
        ] = []  # newcomers prefilled a chunk per step, oldest first
        self.forward_calls = 0  # prefills and decode steps; tests count what a row costs
        # Whether someone waits to join (the scheduler's queue): a chunk pauses for them.
        self.pause_when: Callable[[], bool] | None = None
        self._pausable = PausableForward(model)
        self.fused_step = fused_step
        self.heap = heap  # told of each row that leaves: a document's KV goes back to the system
        # The fused step is built for the modules it reads: rebuilt when they are swapped.
        self._llama_step: LlamaStep | None = None
        self._weights: tuple[tuple[int, bool | None], ...] = ()

    def __len__(self) -> int:
        return len(self.rows) + sum(len(prefill.rows) for prefill in self.pending)

    @property
    def width(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    # -- joining --------------------------------------------------------------

    @torch.inference_mode()
    def add(self, rows: list[Row]) -> list[Row]:
        """Prefill `rows`, pick their first tokens and join them to the batch; returns rows already done."""
        if not rows:
            return []
        for row in rows:
            row.prepare(self.stop_criteria)
        self._use_weights()
        prefill = self._reusing_prefill(list(rows))
        ids, mask = prefill.ids, prefill.mask
        if self._read_in_chunks(ids.shape[1]):
            # A long prompt is prefilled a chunk per step (in step()): rows decoding wait for one
            # chunk at a time, not for the whole prompt, and newcomers join between chunks.
            self.pending.append(prefill)
            return []
        return self._join(prefill, self._forward(ids, mask, prefill.cache))

    def _read_in_chunks(self, tokens: int) -> bool:
        """Whether a prompt of `tokens` new tokens is prefilled over several steps: always when
        longer than a chunk while others decode or wait, and alone when longer than a chunk read
        alone (a document), so whoever arrives during it is not stuck behind the whole of it."""
        if not self.prefill_chunk or tokens <= self.prefill_chunk:
            return False
        return bool(self.rows or self.pending) or tokens > self._chunk_alone

    @property
    def _chunk_alone(self) -> int:
        # Nobody decoding waits on a chunk then: a longer one reads a document faster.
        return self.prefill_chunk * self.CHUNK_ALONE_FACTOR

    def _join(self, prefill: ChunkedPrefill, logits: torch.Tensor) -> list[Row]:
        """Prefilled rows join the batch and pick their first tokens; returns rows already done."""
        self._merge(prefill.rows, prefill.cache, prefill.mask)
        done = self._choose(prefill.rows, logits)
        # Their prompts, for whoever continues or shares them: after the first tokens were
        # chosen, so copying a long prompt's KV never delays them (rows done are stored already).
        self._remember([row for row in prefill.rows if row.reason is None])
        return done

    def _use_weights(self) -> None:
        """Notice modules swapped since the last newcomers (quantizing or wrapping linears, at
        load or in tests): the fused step reads the old ones' tensors, so it is built again."""
        weights = tuple(
            (id(module), getattr(module, "int8_activations", None))
            for module in self.model.modules()
        )
        if weights != self._weights:
            self._weights = weights
            helpers = self.threads.step_helpers if self.threads is not None else 0
            self._llama_step = (
                prepare_llama_step(self.model, helpers)[0] if self.fused_step else None
            )

    # -- prefix reuse -----------------------------------------------------------

    def _reusing_prefill(self, rows: list[Row]) -> ChunkedPrefill:
        """The newcomers' prefill, starting from the longest stored prefix each can use.

        A batched forward pass costs the width of its longest remainder for every row, so a
        row reuses at most `len(ids) - width` columns: its reused KV then ends where its
        remainder starts, with no padding between them, at no extra cost.
        """
        prompts = [row.request.input_ids for row in rows]
        if self.store is None or not self.store.enabled:
            ids, mask = left_pad(prompts, self.pad_id, self.model.device)
            if self.store is not None:
                self.store.count(computed=sum(len(p) for p in prompts), reused=0)
            return ChunkedPrefill(rows, ids, mask)
        # Quantizing or wrapping linears swaps modules: KV computed before must not be read.
        self.store.use_weights(self._weights)
        self._share_prefixes(prompts, [row.request.tag for row in rows])
        # At least the last id is always fed: its logits pick the first token.
        found = [self.store.longest(p, len(p) - 1) for p in prompts]
        width = max(len(p) - reused for p, (reused, _) in zip(prompts, found, strict=True))
        taken = [max(0, len(p) - width) for p in prompts]
        ids, mask = left_pad(
            [p[t:] for p, t in zip(prompts, taken, strict=True)], self.pad_id, self.model.device
        )
        cache, past = self._reused_cache([e for _, e in found], taken)
        self.store.count(computed=int(mask.sum()), reused=sum(taken))
        return ChunkedPrefill(
            rows, ids, torch.cat([past, mask], dim=1), cache=cache, past=past.shape[1]
        )

    def _reused_cache(
        self, entries: list[PrefixEntry | None], taken: list[int]
    ) -> tuple[DynamicCache, torch.Tensor]:
        """A cache holding each row's first `taken` columns from its entry, right-aligned, and its mask."""
        cache, width = GrowingCache(), max(taken)
        mask = torch.zeros((len(taken), width), dtype=torch.long, device=self.model.device)
        if not width:
            return cache, mask
        sample = next(e for e, t in zip(entries, taken, strict=True) if t)
        if len(taken) == 1:  # a lone row: its entry's columns as they are (the cache copies them)
            for layer in range(len(sample.keys)):
                cache.update(
                    sample.keys[layer][:, :, :width], sample.values[layer][:, :, :width], layer
                )
            return cache, mask + 1
        for layer in range(len(sample.keys)):
            keys, values = (
                t.new_zeros((len(taken), t.shape[1], width, t.shape[3]))
                for t in (sample.keys[layer], sample.values[layer])
            )
            for row, (entry, count) in enumerate(zip(entries, taken, strict=True)):
                if count:
                    keys[row, :, width - count :] = entry.keys[layer][0, :, :count]
                    values[row, :, width - count :] = entry.values[layer][0, :, :count]
            cache.update(keys, values, layer)
        for row, count in enumerate(taken):
            mask[row, width - count :] = 1
        return cache, mask

    def _share_prefixes(self, prompts: list[list[int]], tags: list[str]) -> None:
        """Prefill once, into the store, the longest prefix each newcomer shares with another
        newcomer (when the store does not hold it yet), so they all reuse it; filed under the
        tags of the newcomers it begins."""
        if len(prompts) < 2:
            return
        tensors = [torch.tensor(p, dtype=torch.long) for p in prompts]
        shared: dict[tuple[int, ...], None] = {}
        for index, mine in enumerate(tensors):
            best = 0
            for other, theirs in enumerate(tensors):
                if other != index:
                    best = max(best, common_prefix(mine, theirs, len(mine) - 1))
            if best >= self.shared_prefix_min:
                shared[tuple(prompts[index][:best])] = None
        for prefix in sorted(shared, key=len):  # shorter first: the longer ones build on them
            held = self.store.longest(list(prefix), len(prefix))[0]
            if len(prefix) - held >= self.shared_prefix_min:  # a few tokens are not worth a pass
                begun = {
                    tag
                    for p, tag in zip(prompts, tags, strict=True)
                    if p[: len(prefix)] == list(prefix)
                }
                self._prefill_alone(list(prefix), begun)

    def _prefill_alone(self, ids: list[int], tags: set[str]) -> None:
        """Compute the KV of `ids` (reusing what the store has) and store it under `tags`."""
        reused, entry = self.store.longest(ids, len(ids) - 1)
        cache, past = self._reused_cache([entry], [reused])
        fed = torch.tensor([ids[reused:]], device=self.model.device)
        self._forward(fed, torch.cat([past, torch.ones_like(fed)], dim=1), cache)
        self.store.count(computed=len(ids) - reused, reused=reused)
        self.store.put(ids, [k.keys for k in cache.layers], [v.values for v in cache.layers], tags)

    def _remember(self, rows: list[Row]) -> None:
        """Store the KV each of `rows` (in the batch, not cancelled) holds: its prompt and the
        answer tokens already fed (the last chosen one is not, yet)."""
        if self.store is None or not self.store.enabled:
            return
        for row in rows:
            index = next(i for i, r in enumerate(self.rows) if r is row)
            held = len(row.request.input_ids) + max(0, len(row.new_ids) - 1)
            if held > self.width or not bool(self.mask[index, self.width - held :].all()):
                continue  # not the layout this expects: store nothing rather than a wrong KV
            self.store.put(
                (row.request.input_ids + row.new_ids)[:held],
                [layer.keys[index : index + 1, :, -held:] for layer in self.cache.layers],
                [layer.values[index : index + 1, :, -held:] for layer in self.cache.layers],
                (row.request.tag,),
            )

    def _advance_prefill(self) -> list[Row] | None:
        """Feed the pending prefill with the least left to read its next chunk (a short prompt
        never waits behind a document); when it is complete, its rows join. None: the chunk
        paused between two layers, for someone waiting to join or a cancel; it goes on later."""
        if not self.pending:
            return []
        prefill = min(self.pending, key=lambda p: p.left)
        ids, mask = prefill.chunk(self.prefill_chunk if self.rows else self._chunk_alone)
        self._use_threads(ids)
        waiting = self.pause_when

        def pause() -> bool:
            return prefill.cancelled() or (waiting is not None and waiting())

        if prefill.paused is not None:
            logits = self._pausable.resume(prefill.paused, pause)
        else:
            self.forward_calls += 1
            logits = self._pausable.run(
                lambda: self._model_forward(ids, mask, prefill.cache), pause
            )
        if isinstance(logits, Paused):
            prefill.paused = logits
            return None
        prefill.read()
        if prefill.left:
            prefill.report()
            return []
        self.pending.remove(prefill)
        return self._join(prefill, logits)

    def _first_text_due(self) -> bool:
        return any(not row.shown and len(row.new_ids) < self.FIRST_TOKENS for row in self.rows)

    def _merge(self, rows: list[Row], cache: DynamicCache, mask: torch.Tensor) -> None:
        if self.cache is None:
            self.rows, self.cache, self.mask = list(rows), cache, mask
            return
        width = max(self.width, mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_pad_left(old.keys, width), _pad_left(new.keys, width)])
            old.values = torch.cat([_pad_left(old.values, width), _pad_left(new.values, width)])
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
        self.rows.extend(rows)

    # -- stepping -------------------------------------------------------------

    def drop_cancelled(self) -> list[Row]:
        """Rows whose cancel flag is set leave before the next step; returns them."""
        gone = [row for row in self.rows if row.request.cancel.is_set()]
        for row in gone:
            row.end("cancelled")
        self._keep([row for row in self.rows if row.reason is None])
        for prefill in list(self.pending):
            cancelled = [row for row in prefill.rows if row.request.cancel.is_set()]
            for row in cancelled:
                row.end("cancelled")
            if cancelled:
                prefill.keep([row for row in prefill.rows if row.reason is None])
                if not prefill.rows:
                    self.pending.remove(prefill)
                self._left(cancelled)
            gone.extend(cancelled)
        return gone

    @torch.inference_mode()
    def step(self) -> list[Row]:
        """One prefill chunk of a pending newcomer (none while a row that just joined has yet to
        show text), then one decode step for every row; returns the rows that ended (already
        dropped). A chunk paused for someone waiting ends the step: they join before it goes on."""
        joined: list[Row] = []
        if not self._first_text_due():
            advanced = self._advance_prefill()
            if advanced is None:
                return []
            joined = advanced
        if not self.rows:
            return joined
        last = torch.tensor([[row.new_ids[-1]] for row in self.rows], device=self.model.device)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        logits = self._forward(last, self.mask, self.cache)
        return joined + self._choose(self.rows, logits)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        self.forward_calls += 1
        self._use_threads(ids)
        if self._llama_step is not None and ids.numel() <= MAX_FUSED_TOKENS:
            logits = self._llama_step(ids, mask, cache)
            if logits is not None:
                return logits
        return self._model_forward(ids, mask, cache)

    def _use_threads(self, ids: torch.Tensor) -> None:
        if self.threads is not None:
            self.threads.use(ids.numel())

    def _model_forward(
        self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        # Each row counts its own positions: padding on the left must not shift them.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def _choose(self, rows: list[Row], logits: torch.Tensor) -> list[Row]:
        """Pick each row's next token under its own rules, feed it to its stream, drop rows that ended."""
        now = time.perf_counter()
        for row, token in zip(rows, next_tokens(rows, logits), strict=True):
            row.accept(token, now)
        done = [row for row in rows if row.reason is not None]
        if done:
            self._remember(done)  # ended by their own rules here, never cancelled
            self._keep([row for row in self.rows if row.reason is None])
        return done

    def _keep(self, rows: list[Row]) -> None:
        """Select `rows` (a subset, in order) in the cache and trim padding nobody needs any more."""
        if len(rows) == len(self.rows):
            return
        kept = {id(row) for row in rows}
        leaving = [row for row in self.rows if id(row) not in kept]
        self._select(rows)
        self._left(leaving)

    def _left(self, rows: list[Row]) -> None:
        """Tell the heap trimmer of rows that left, once their KV is no longer referenced."""
        if self.heap is None:
            return
        for row in rows:
            self.heap.ended(len(row.request.input_ids) + len(row.new_ids))
        if not self.rows and not self.pending:
            self.heap.idle()

    def _select(self, rows: list[Row]) -> None:
        if not rows:
            self.rows, self.cache, self.mask = [], None, None
            return
        indices = row_indices(self.rows, rows, self.mask.device)
        self.cache.batch_select_indices(indices)
        self.mask = self.mask[indices]
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if used.numel() else 0
        if start:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.keys = layer.keys[..., start:, :]
                layer.values = layer.values[..., start:, :]
        self.rows = rows


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the sequence axis (-2 for cache tensors [b, h, t, d], -1 for masks) on the left."""
    axis = -1 if tensor.dim() == 2 else -2
    missing = width - tensor.shape[axis]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=axis)
