"""A policy's regression set run through a draft (or the stored policy) on the live engine.

Each case is a prompt and the outcome its answer must have. The cases run together, so the
scheduler batches them, through chat/turns/trial.py: nothing is stored as a conversation, counted
or cached; only the run's summary and per-case results are kept (RegressionRun).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

from ..infra.engines import EngineSpec
from ..models import RegressionCase, RegressionRun
from ..protocol.events import Finish
from ..stores.policy_store import ResolvedPolicy
from .finish import Verdict
from .refusals import TurnError
from .trial import TrialResult, trial_run

Expected = RegressionCase.Expected


def outcomes_of(result: TrialResult) -> set[str]:
    """The expected outcomes (RegressionCase.Expected) a trial's answer satisfies.

    - delivered: the model's answer reached the user whole (valid, neither cut nor changed);
    - valid_json: it was accepted as JSON (buffer or auto mode's held block);
    - moderated: a hook withdrew it;
    - masked: accepted, but what the user got differs from what the model wrote (a hook
      replaced part of it), without being cut;
    - cut: cut short at a loop, an invented turn or the length limit; the good part stands.
    """
    got: set[str] = set()
    ok = result.outcome == Verdict.OK
    if result.finish_reason == Finish.MODERATED:
        got.add(Expected.MODERATED)
    if result.finish_reason == Finish.CUT:
        got.add(Expected.CUT)
    if ok and result.json_value is not None:
        got.add(Expected.VALID_JSON)
    if ok and result.finish_reason != Finish.CUT:
        got.add(Expected.DELIVERED if result.text == result.raw_text else Expected.MASKED)
    return got


@dataclass
class CaseResult:
    prompt: str
    expected: str
    got: list[str]
    passed: bool
    reason: str  # a hook's or the validator's words, or the error that stopped the case
    text: str  # what the user would get


async def _one(
    policy: ResolvedPolicy, prompt: str, expected: str, engine: EngineSpec | None
) -> CaseResult:
    try:
        result = await trial_run(policy=policy, text=prompt, user_id=None, engine=engine)
    except TurnError as exc:
        return CaseResult(prompt, expected, [], False, str(exc), "")
    got = outcomes_of(result)
    reason = result.error or result.reason
    return CaseResult(prompt, expected, sorted(got), expected in got, reason, result.text)


async def regressions_run(
    policy: ResolvedPolicy, cases: list[tuple[str, str]], engine: EngineSpec | None = None
) -> list[CaseResult]:
    """Every (prompt, expected) case through `policy` on its `engine` (None: the default), at
    once; results in the cases' order."""
    return list(await asyncio.gather(*(_one(policy, p, e, engine) for p, e in cases)))


def run_record(
    *, policy_id: int, version: int, draft: bool, user_id: int | None, results: list[CaseResult]
) -> RegressionRun:
    """Keep a finished run; the one before it is `previous_run`."""
    return RegressionRun.objects.create(
        policy_id=policy_id,
        policy_version=version,
        draft=draft,
        ran_by_id=user_id,
        passed=sum(r.passed for r in results),
        total=len(results),
        results=[asdict(r) for r in results],
    )


def previous_run(run: RegressionRun) -> RegressionRun | None:
    """The policy's run before `run`: the pass rate staff compare with."""
    return (
        RegressionRun.objects.filter(policy_id=run.policy_id, id__lt=run.pk).order_by("-id").first()
    )
