"""How each output policy behaves in production: per policy and version, the share of finished
answers delivered, re-asked, fallen back, refused, moderated, masked and cut, per time bucket.

Read from what every stored answer already records (chat/turns/finish.py): its status, finish
reason, outcome, re-ask count, and the text the user got beside the model's raw text. The
buckets are the latency page's (chat/infra/latency.py). Everything but `fetch_answers` and
`behaviour_report` is pure, so the counting can be tested on plain tuples.

What each share counts, of the answers that finished (status `done`; cancelled and failed ones
are counted apart):
* delivered: the model's answer reached the user whole (an engine finish: eos, stop string or
  length; the text the user got is the model's);
* masked: an engine finish, but the user got other text than the model wrote (a hook replaced
  part of it); answers stored before raw texts were kept count as delivered;
* re-asked: the model was asked again at least once (whatever came of it);
* fallen back: invalid after every re-ask, and the user got the policy's fallback text;
* refused: invalid after every re-ask, and the user kept only what was already shown (in buffer
  mode: nothing);
* moderated: a hook withdrew the answer;
* cut: a hook cut the answer short (a loop, an invented turn); its good part stands.
Answers served from the cache replay their first verdict and are counted as what users got.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .latency import MAX_ROWS, bucket_bounds, bucket_index, bucket_width

# In the order the page lists them.
KINDS = ("delivered", "reasked", "fell_back", "refused", "moderated", "masked", "cut")
LABELS = {
    "delivered": "delivered",
    "reasked": "re-asked",
    "fell_back": "fallen back",
    "refused": "refused",
    "moderated": "moderated",
    "masked": "masked",
    "cut": "cut",
}
ENGINE_FINISH = {"eos", "stop_string", "length"}


def kinds_of(
    finish_reason: str, retries: int, same_text: bool, kept_prefix: bool, has_raw: bool
) -> set[str]:
    """The kinds (KINDS) one finished answer counts as.

    `same_text`: the user got exactly the raw text; `kept_prefix`: what the user got begins the
    raw text; `has_raw`: a raw text was stored at all.
    """
    kinds = set()
    if retries:
        kinds.add("reasked")
    if finish_reason in ENGINE_FINISH:
        kinds.add("masked" if has_raw and not same_text else "delivered")
    elif finish_reason == "invalid":
        kinds.add("refused" if kept_prefix else "fell_back")
    elif finish_reason in ("moderated", "cut"):
        kinds.add(finish_reason)
    return kinds


@dataclass
class Counts:
    """Finished answers and how many of them count as each kind."""

    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    def add(self, status: str, kinds: set[str]) -> None:
        if status == "cancelled":
            self.cancelled += 1
        elif status == "failed":
            self.failed += 1
        elif status == "done":
            self.finished += 1
            for kind in kinds:
                self.kinds[kind] += 1

    def share(self, kind: str) -> float | None:
        return self.kinds[kind] / self.finished if self.finished else None

    @property
    def shares(self) -> dict[str, float | None]:
        return {kind: self.share(kind) for kind in KINDS}


@dataclass(frozen=True)
class Bucket:
    start: datetime
    end: datetime
    counts: Counts

    @property
    def mid(self) -> datetime:
        return self.start + (self.end - self.start) / 2

    @property
    def count(self) -> int:
        return self.counts.finished


@dataclass(frozen=True)
class BehaviourReport:
    since: datetime
    until: datetime
    hours: int
    width: timedelta
    buckets: list[Bucket]  # the selected answers over time
    totals: Counts  # the selected answers
    # Every policy and version seen in the window, newest version first: (policy id, version).
    versions: dict[tuple[int | None, int | None], Counts]
    truncated: bool = False

    @property
    def is_empty(self) -> bool:
        return self.totals.finished == 0


def summarize(
    rows: Iterable[Sequence],
    *,
    until: datetime,
    hours: int,
    policy_id: int | None = None,
    version: int | None = None,
    truncated: bool = False,
) -> BehaviourReport:
    """The report for rows of (created_at, policy_id, policy_version, status, finish_reason,
    retries, same_text, kept_prefix, has_raw) over the `hours` before `until`. Every policy's
    totals are kept; the buckets and totals are of `policy_id` (and `version`) when given."""
    since = until - timedelta(hours=hours)
    width = bucket_width(hours)
    bounds = bucket_bounds(since, until, width)
    buckets = [Bucket(start, end, Counts()) for start, end in bounds]
    totals = Counts()
    versions: dict[tuple[int | None, int | None], Counts] = {}
    for created_at, pid, pversion, status, finish, retries, same, prefix, has_raw in rows:
        if created_at < since or created_at > until:
            continue
        kinds = kinds_of(finish or "", retries or 0, bool(same), bool(prefix), bool(has_raw))
        versions.setdefault((pid, pversion), Counts()).add(status, kinds)
        if policy_id is not None and pid != policy_id:
            continue
        if version is not None and pversion != version:
            continue
        totals.add(status, kinds)
        index = bucket_index(created_at, until, width, len(bounds))
        if index is not None:
            buckets[index].counts.add(status, kinds)
    ordered = dict(sorted(versions.items(), key=lambda item: (item[0][0] or 0, -(item[0][1] or 0))))
    return BehaviourReport(since, until, hours, width, buckets, totals, ordered, truncated)


def fetch_answers(
    since: datetime, until: datetime, limit: int = MAX_ROWS, engine: str = ""
) -> tuple[list[tuple], bool]:
    """The rows `summarize` takes, of the newest `limit` assistant messages in the window (of one
    engine, by the name its answers' metrics carry, when `engine` is given), and whether there
    were more. The texts are compared in the database; only booleans come back."""
    from django.db.models import BooleanField, ExpressionWrapper, F, Q

    from ..models import Message

    def flag(condition: Q) -> ExpressionWrapper:
        return ExpressionWrapper(condition, output_field=BooleanField())

    answers = Message.objects.filter(
        role=Message.Role.ASSISTANT, created_at__gte=since, created_at__lte=until
    )
    if engine:
        answers = answers.filter(metrics__engine=engine)
    rows = list(
        answers.annotate(
            # A mask leaves the raw text masked too; the answer's metrics say it happened.
            same_text=flag(Q(text=F("raw_text")) & ~Q(metrics__has_key="masked")),
            kept_prefix=flag(Q(raw_text__startswith=F("text"))),
            has_raw=flag(~Q(raw_text="")),
        )
        .order_by("-created_at", "-id")
        .values_list(
            "created_at",
            "policy_id",
            "policy_version",
            "status",
            "finish_reason",
            "retries",
            "same_text",
            "kept_prefix",
            "has_raw",
        )[: limit + 1]
    )
    return rows[:limit], len(rows) > limit


def behaviour_report(
    hours: int,
    *,
    policy_id: int | None = None,
    version: int | None = None,
    now: datetime | None = None,
    limit: int = MAX_ROWS,
    engine: str = "",
) -> BehaviourReport:
    from django.utils import timezone

    until = now or timezone.now()
    rows, truncated = fetch_answers(until - timedelta(hours=hours), until, limit, engine)
    return summarize(
        rows,
        until=until,
        hours=hours,
        policy_id=policy_id,
        version=version,
        truncated=truncated,
    )
