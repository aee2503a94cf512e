"""A draft policy tried on one prompt, for staff: the live engine and the turn's own gate, re-asks,
cuts and fallbacks (`TurnRun`), but nothing published, stored or cached.

What it gives back is what staff need to judge the draft side by side: the raw model text, what
the user would get, every event the user's client would have seen, which hook stopped the answer
and why, each re-asked attempt with its validation error, and the turn's timings. A hook whose
service failed is named with its status only ("the service answered HTTP 500"): never what the
service replied, which would make the trial a reader of any address the hook can call.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field, replace

from asgiref.sync import sync_to_async

from ..engine.types import EngineError, Failed
from ..infra.engines import EngineSpec
from ..infra.runtime import NotReady, runtime
from ..models import Conversation, Message
from ..policy.http import service_failures
from ..protocol import Prompt, events
from ..protocol.events import Finish, event_fields
from ..stores.policy_store import ResolvedPolicy
from ..stores.selectors import Owner
from .finish import Verdict
from .limits import turn_rate_check
from .prepare import Prepared, check_prompt_tokens
from .prompting import fit_prompt, request_for
from .refusals import TurnError
from .run import TurnRun


@dataclass
class Attempt:
    """One generation of the trial: the first answer, or a re-ask after `error`."""

    text: str
    error: str


@dataclass
class TrialResult:
    """The draft's answer to one prompt, as staff see it in the workbench."""

    prompt: str
    raw_text: str = ""  # what the model generated, a part cut off included
    text: str = ""  # what the user would get in the end
    finish_reason: str = ""
    outcome: str = ""  # ok, invalid or moderated; empty for a cancelled or failed run
    reason: str = ""  # why it was cut, withdrawn or refused: a hook's or the validator's words
    json_value: object = None
    attempts: list[Attempt] = field(default_factory=list)  # each answer that was re-asked
    events: list[dict] = field(default_factory=list)  # the user's wire events, with `at_ms`
    metrics: dict = field(default_factory=dict)
    error: str = ""  # the engine failed
    hook_failures: list[str] = field(default_factory=list)  # "hook: status", each service call

    @property
    def fired(self) -> str:
        """The kind of intervention the user would have seen, in a word."""
        if self.finish_reason in (Finish.MODERATED, Finish.CUT):
            return self.finish_reason
        if self.outcome == Verdict.INVALID:
            return "invalid"
        return ""


class TrialRun(TurnRun):
    """A TurnRun whose answer is recorded for staff instead of stored, counted or cached."""

    def __init__(self, prepared: Prepared, prompt: Prompt, **kwargs):
        self.trial = TrialResult(prompt=prompt.text)
        self._began = kwargs["accepted_at"]
        super().__init__(Owner(None, ""), prompt, prepared, send=self._record_event, **kwargs)

    async def _record_event(self, event: events.Event) -> None:
        entry = {"type": type(event).__name__.lower(), **event_fields(event)}
        entry.pop("request_id", None)
        entry["at_ms"] = round((time.perf_counter() - self._began) * 1000, 1)
        self.trial.events.append(entry)

    async def run(self) -> None:
        await self._run()  # never one of the process's running turns: nobody may cancel it

    def _reask(self, bad_answer: str, reason: str) -> bool:
        self.trial.attempts.append(Attempt(bad_answer, reason))
        return super()._reask(bad_answer, reason)

    def _count_invalid(self) -> None:
        """Not counted: a draft's failures are not production's."""

    async def _store(
        self, *, text, finish_reason, done_metrics, raw, outcome, reason, json_value, explanation
    ):
        """Kept for staff, who see the raw text and the reason; the user's explanation is not
        needed here."""
        trial = self.trial
        trial.raw_text, trial.text = raw, text
        trial.finish_reason, trial.outcome = str(finish_reason), str(outcome)
        trial.reason, trial.json_value, trial.metrics = reason, json_value, done_metrics

    async def _account(self, *args) -> None:
        """Neither counted in the process's metrics nor cached."""

    async def _charge(self, done_metrics: dict) -> None:
        """Charged to nobody's budget: staff trying a draft."""

    async def _fail(self, event: Failed, partial_text: str) -> None:
        self.trial.text = partial_text
        self.trial.error = event.error
        self.trial.metrics = self._metrics(event.at, None)


def trial_prepare(policy: ResolvedPolicy, text: str, backend) -> tuple[Prepared, Prompt]:
    """The draft's model input for `text`, as a new conversation's first prompt; nothing stored."""
    check_prompt_tokens(backend, text)
    # A draft's answers are never served from or written to the cache.
    policy = replace(policy, cache_enabled=False)
    prompt = Prompt(
        request_id=f"trial-{uuid.uuid4().hex[:12]}", text=text, conversation=None, policy=None
    )
    try:
        messages, rendered, input_ids = fit_prompt(backend, policy, [], text)
    except EngineError as exc:
        raise TurnError(exc.code, str(exc)) from None
    request = request_for(backend, policy, input_ids, prompt.request_id, messages)
    # Unsaved rows: the run reads their ids only, and they stay None.
    prepared = Prepared(Conversation(), Message(), policy, messages, rendered, request, None, text)
    return prepared, prompt


async def trial_run(
    *,
    policy: ResolvedPolicy,
    text: str,
    user_id: int | None,
    engine: EngineSpec | None = None,
) -> TrialResult:
    """Answer `text` under the draft `policy` on the live `engine` (None: the default engine)
    and say what happened.

    Counted against the staff member `user_id`'s prompts per minute like a chat turn (None: the
    caller counted it, as a regression run counts once). TurnError says why not
    (`rate_limited`, `model_loading`, `prompt_too_long`, a full queue).
    """
    if user_id is not None:
        turn_rate_check(owner=Owner(user_id, ""))
    try:
        if engine is None:
            serving = runtime.serving(None)
        else:  # a remote engine's first use builds it: a few questions to its server
            serving = await sync_to_async(runtime.serving, thread_sensitive=False)(engine)
    except NotReady as exc:
        raise TurnError(exc.code, str(exc)) from None
    backend, stack = serving.backend, serving.stack
    accepted_at = time.perf_counter()
    # Tokenizing is CPU work: off the event loop, as a turn's preparing is.
    prepared, prompt = await sync_to_async(trial_prepare, thread_sensitive=False)(
        policy, text, backend
    )
    run = TrialRun(
        prepared,
        prompt,
        backend=backend,
        stack=stack,
        accepted_at=accepted_at,
        serving=serving,
    )
    try:
        run.submit(prepared.request)
    except EngineError as exc:
        raise TurnError(exc.code, str(exc)) from None
    with service_failures() as failures:
        await run.run()
    run.trial.hook_failures = failures
    return run.trial


@dataclass
class EngineTrial:
    """The draft's answer on one engine of a side-by-side trial, or why that engine did not run it."""

    engine: str  # its name; "default" for the engine CHAT_BACKEND describes
    result: TrialResult | None = None
    problem: str = ""


async def trial_side_by_side(
    *, policy: ResolvedPolicy, text: str, user_id: int | None, engines: list[EngineSpec | None]
) -> list[EngineTrial]:
    """The draft answering `text` on each of `engines` at once, counted as one prompt; an engine
    that cannot run it (down, loading, the prompt too long for it) says so in its own column."""
    if user_id is not None:
        turn_rate_check(owner=Owner(user_id, ""))

    async def on(engine: EngineSpec | None) -> EngineTrial:
        name = engine.name if engine is not None else "default"
        try:
            result = await trial_run(policy=policy, text=text, user_id=None, engine=engine)
        except TurnError as exc:
            return EngineTrial(name, problem=str(exc))
        return EngineTrial(name, result)

    return list(await asyncio.gather(*(on(engine) for engine in engines)))
