"""`manage.py benchmark` rows for prefix KV reuse and in-flight coalescing, in process.

Each row drives the real engine the way the server does: a ContinuousScheduler over the
loaded backend (its prefix store included), requests submitted with `expect` so arrivals
together are gathered, and the Coalescer in front of it for identical prompts. Time to first
token is the model's (the scheduler's submit to the row's first token), so the figures
compare prefill work, not the text decoder's word boundaries.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from chat.engine.local.scheduler import ContinuousScheduler
from chat.engine.sharing.coalescing import Coalescer
from chat.engine.sharing.coalescing_across import AcrossProcesses
from chat.engine.types import Failed, Finished, GenerationResult

SYSTEM = (
    "You are the help desk of a small museum about lighthouses. Answer in two or three short "
    "sentences, politely, and only about the museum, its exhibits, opening hours and tickets. "
    "If you do not know, say so and suggest asking at the front desk."
)
FEW_SHOT = [
    ("When do you open?", "We open at nine every morning and close at five, except Mondays."),
    ("Can I bring my dog?", "Dogs on a lead are welcome in the garden, but not in the halls."),
    ("Is there a café?", "Yes, on the top floor, with a view of the old lamp room."),
]
HISTORY_PARAGRAPH = (
    "The keeper climbed the spiral stairs each evening, trimmed the wick, polished the great "
    "lens and wrote the weather in his log: wind, sea state, the ships that passed, the hour "
    "the lamp was lit and the hour it was put out. "
)
CITIES = ["Lisbon", "Oslo", "Quito", "Hanoi", "Perth"]
STORMY = ["stormy nights", "foggy mornings", "calm evenings", "winter storms", "summer gales"]
QUESTIONS = [
    "How much is a ticket?",
    "Do you have guided tours?",
    "Where can I park?",
    "Is the museum accessible by wheelchair?",
    "Can children climb the tower?",
    "Do you sell postcards?",
    "How old is the oldest lens?",
    "Can I take photographs inside?",
]


def policy_messages(question: str) -> list[dict]:
    """A conversation's opening under one policy: its system prompt, few-shot, then the user."""
    messages = [{"role": "system", "content": SYSTEM}]
    for asked, answered in FEW_SHOT:
        messages += [
            {"role": "user", "content": asked},
            {"role": "assistant", "content": answered},
        ]
    return [*messages, {"role": "user", "content": question}]


@dataclass
class Outcome:
    submitted_at: float
    result: GenerationResult | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def first_token_s(self) -> float | None:
        if self.result is None or self.result.first_token_at is None:
            return None
        return self.result.first_token_at - self.submitted_at


def run_together(scheduler, requests, *, views=None) -> tuple[list[Outcome], float]:
    """Submit `requests` at once (announced first, as the server does); wait for all. Returns
    each one's outcome and the wall time until the last one finished."""
    views = views or [scheduler] * len(requests)
    outcomes = []
    for _ in requests:
        scheduler.expect()
    started = time.perf_counter()
    for request, view in zip(requests, views, strict=True):
        outcome = Outcome(time.perf_counter(), done=threading.Event())

        def sink(event, outcome=outcome):
            if isinstance(event, Finished):
                outcome.result = event.result
                outcome.done.set()
            elif isinstance(event, Failed):
                outcome.error = event.error
                outcome.done.set()

        view.submit(request, sink, expected=True)
        outcomes.append(outcome)
    for outcome in outcomes:
        if not outcome.done.wait(600):
            raise TimeoutError("a benchmark request did not finish in 10 minutes")
    return outcomes, time.perf_counter() - started


def first_token_s(scheduler, request) -> float:
    [outcome], _ = run_together(scheduler, [request])
    if outcome.first_token_s is None:
        raise RuntimeError(outcome.error or "no token")
    return outcome.first_token_s


@dataclass
class FollowUp:
    history_tokens: int
    fresh_s: float  # a one-line prompt in a new conversation, empty store
    follow_up_s: float  # the next turn of a long conversation, its history reused
    without_reuse_s: float  # the same turn with the store off (what every turn paid before)
    reused: int
    computed: int

    @property
    def ratio(self) -> float:
        return self.follow_up_s / self.fresh_s


def follow_up(backend, scheduler, history_tokens: int = 1500, rounds: int = 3) -> FollowUp:
    """(a) A follow-up turn with ~`history_tokens` of history vs a fresh one-line prompt, each
    asked `rounds` times alternately (new words each time, so neither reuses its own last
    question); medians, as other work shares the CPUs."""
    import statistics

    store = backend.prefix_store
    messages = [{"role": "user", "content": "Tell me about the keeper's log."}]
    while len(backend.encode(messages)) < history_tokens:
        messages += [
            {"role": "assistant", "content": HISTORY_PARAGRAPH * 3},
            {"role": "user", "content": "Go on."},
        ]
    store.clear()
    # The previous turn, as the server would have run it: its KV is kept when it ends.
    [previous], _ = run_together(scheduler, [backend.request(messages, max_new_tokens=24)])
    history = [*messages, {"role": "assistant", "content": previous.result.text}]
    fresh, follow = [], []
    for n in range(rounds):
        # A new conversation: it shares at most the chat template's default system prompt.
        fresh_prompt = [{"role": "user", "content": f"What time is it in {CITIES[n]}?"}]
        fresh.append(first_token_s(scheduler, backend.request(fresh_prompt, max_new_tokens=1)))
        ask = f"And what did he write on {STORMY[n]}?"
        request = backend.request([*history, {"role": "user", "content": ask}], max_new_tokens=1)
        computed, reused = store.computed_tokens, store.reused_tokens
        follow.append(first_token_s(scheduler, request))
        computed, reused = store.computed_tokens - computed, store.reused_tokens - reused
    store.clear()
    without_s = first_token_s(scheduler, request)
    return FollowUp(
        len(request.input_ids),
        statistics.median(fresh),
        statistics.median(follow),
        without_s,
        reused,
        computed,
    )


@dataclass
class SharedPolicy:
    users: int
    prompt_tokens: int  # all users' prompts together
    shared_tokens: int  # the policy's system prompt and few-shot, as every user's prompt opens
    computed: int
    reused: int
    # Tokens a row re-feeds in columns that are padding anyway: a batched prefill is as wide as
    # its longest remainder, and a row's reused KV ends where its remainder starts.
    alignment: int

    @property
    def once(self) -> int:
        """Prompt tokens to compute with the opening computed once (and the alignment, free)."""
        return self.prompt_tokens - (self.users - 1) * self.shared_tokens + self.alignment


def shared_policy(backend, scheduler, users: int = 8) -> SharedPolicy:
    """(b) `users` different users open a conversation with the same policy at once."""
    store = backend.prefix_store
    store.clear()
    requests = [
        backend.request(policy_messages(question), max_new_tokens=8)
        for question in QUESTIONS[:users]
    ]
    opening = [r.input_ids for r in requests]
    shared = min(_common(opening[0], ids) for ids in opening[1:])
    remainders = [len(ids) - shared for ids in opening]
    computed, reused = store.computed_tokens, store.reused_tokens
    run_together(scheduler, requests)
    return SharedPolicy(
        users,
        sum(len(ids) for ids in opening),
        shared,
        store.computed_tokens - computed,
        store.reused_tokens - reused,
        sum(max(remainders) - r for r in remainders),
    )


@dataclass
class Identical:
    users: int
    one_s: float  # one answer alone
    together_s: float  # `users` identical prompts at once, coalesced
    generations: int
    complete: int
    tokens: int
    processes: int = 1  # Coalescers the prompts were split between (2: across Redis)

    @property
    def ratio(self) -> float:
        return self.together_s / self.one_s


def identical(
    backend,
    scheduler,
    users: int = 8,
    tokens: int = 64,
    rounds: int = 3,
    *,
    redis_url: str | None = None,
) -> Identical:
    """(c) `users` identical prompts at once: one generation, every answer complete. One answer
    and the coalesced ones alternate for `rounds`; medians, as other work shares the CPUs.
    With `redis_url`, the prompts alternate between two Coalescers that share that Redis, as
    two processes' turns would (coalescing_across.py; the one engine here runs for both)."""
    messages = [{"role": "user", "content": "Describe the lamp room of a lighthouse."}]

    def request():
        return backend.request(messages, max_new_tokens=tokens, min_new_tokens=tokens)

    import statistics

    ones, togethers, generations, complete = [], [], [], []
    inner_submit = scheduler.submit
    for _ in range(rounds):
        ones.append(run_together(scheduler, [request()])[1])
        coalescers = [Coalescer()] if redis_url is None else [Coalescer(), Coalescer()]
        if redis_url is not None:
            for coalescer in coalescers:
                coalescer.across = AcrossProcesses(lambda: redis_url)
        submitted: list[int] = []

        def counting(*args, submitted=submitted, **kwargs):
            submitted.append(1)
            return inner_submit(*args, **kwargs)

        scheduler.submit = counting
        try:
            views = [
                coalescers[n % len(coalescers)].sharing(scheduler, "identical")
                for n in range(users)
            ]
            outcomes, together_s = run_together(scheduler, [request() for _ in views], views=views)
        finally:
            del scheduler.submit
        togethers.append(together_s)
        generations.append(len(submitted))
        complete.append(
            sum(
                1
                for o in outcomes
                if o.result is not None
                and o.result.finish_reason == "length"
                and o.result.new_tokens == tokens
            )
        )
    return Identical(
        users,
        statistics.median(ones),
        statistics.median(togethers),
        max(generations),
        min(complete),
        tokens,
        len(coalescers),
    )


@dataclass
class Budget:
    budget_bytes: int
    held_bytes: int
    entries: int
    evictions: int
    stored_tokens: int  # KV offered to the store, in tokens
    rss_mb: float  # this process now, the store full
    peak_rss_mb: float  # this process's peak so far (long prefills without reuse included)


def budget(backend, scheduler, rows: int = 8, tokens: int = 600) -> Budget:
    """(d) Offer the store more KV than its budget, two conversations at a time as a server
    would take them; it stays within it, and the process's RSS with it. Run first, before the
    other rows' long prefills without reuse raise the process's high-water mark."""
    import os

    from bench.benchmarking import self_peak_rss_mb
    from harness.liveserver import process_status_mb

    store = backend.prefix_store
    store.clear()
    evictions = store.evictions
    paragraphs = max(
        1, tokens // len(backend.encode([{"role": "user", "content": HISTORY_PARAGRAPH}]))
    )
    requests = [
        backend.request(
            [{"role": "user", "content": f"Document {n}. " + HISTORY_PARAGRAPH * paragraphs}],
            max_new_tokens=2,
        )
        for n in range(rows)
    ]
    for pair in range(0, rows, 2):
        run_together(scheduler, requests[pair : pair + 2])
    return Budget(
        store.max_bytes,
        store.nbytes,
        len(store),
        store.evictions - evictions,
        sum(len(r.input_ids) for r in requests),
        process_status_mb(os.getpid(), "VmRSS") or 0.0,
        self_peak_rss_mb(),
    )


def run_all(
    backend, note=lambda line: None, *, quick: bool = False, redis_url: str | None = None
) -> dict:
    """Every row on one scheduler of up to 8 rows; returns them by name. `quick`: small sizes
    for a smoke run (the figures then say little). `redis_url`: also the identical prompts
    split between two processes' coalescing on that Redis."""
    history_tokens = 300 if quick else 1500
    scheduler = ContinuousScheduler(backend, max_batch=8)
    try:
        note("  (d) the prefix store offered more than its budget")
        results: dict[str, object] = {"budget": budget(backend, scheduler, rows=4 if quick else 8)}
        note(f"  (a) a follow-up turn with ~{history_tokens} tokens of history")
        results["follow_up"] = follow_up(backend, scheduler, history_tokens)
        note("  (b) 8 users open a conversation with the same policy at once")
        results["shared_policy"] = shared_policy(backend, scheduler)
        note("  (c) 8 identical prompts at once")
        results["identical"] = identical(
            backend, scheduler, tokens=12 if quick else 64, rounds=1 if quick else 3
        )
        if redis_url is not None:
            note("  (c) the same, split between two processes' coalescing on one Redis")
            results["identical_across"] = identical(
                backend,
                scheduler,
                tokens=12 if quick else 64,
                rounds=1 if quick else 3,
                redis_url=redis_url,
            )
    finally:
        scheduler.close()
        backend.prefix_store.clear()
    return results


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
