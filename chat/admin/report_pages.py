"""The admin's report pages: recent answer latency (p50/p95 of TTFT and total time) and how
policies' answers ended, each plotted as inline SVG.

Hooked in by project/urls.py through `admin.site.admin_view`, which requires a signed-in staff
member (anyone else is sent to the admin login); the page itself also needs chat.view_message.
The charts are drawn server-side (charts.py), as plain SVG geometry the template writes out: no
JavaScript, nothing fetched from elsewhere, colours from the admin's CSS variables.
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.views.decorators.http import require_safe

from ..infra import behaviour, latency
from ..infra.feedback_report import FeedbackCounts, feedback_by_version
from ..models import Engine, Message, OutputPolicy
from .charts import RIGHT, WIDTH, Chart, draw_chart, nice_ceiling

PERMISSION = "chat.view_message"
PRESET_HOURS = (
    (1, "1 h"),
    (6, "6 h"),
    (24, "24 h"),
    (72, "3 days"),
    (168, "7 days"),
    (720, "30 days"),
)


def format_ms(value: float | None) -> str:
    """Milliseconds for people: "850 ms", "1.25 s", "—" for no value."""
    if value is None:
        return "—"
    if value < 1000:
        return f"{value:.0f} ms"
    if value < 10_000:
        return f"{value / 1000:.2f} s"
    return f"{value / 1000:.1f} s"


def format_duration(width: timedelta) -> str:
    """A bucket width for people: "30 minutes", "1 hour", "6 hours", "1 day"."""
    minutes = int(width.total_seconds() // 60)
    for size, unit in ((1440, "day"), (60, "hour"), (1, "minute")):
        if minutes % size == 0:
            count = minutes // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{minutes} minutes"


def format_axis(value: float) -> str:
    """A tick label: "250 ms", "1.5 s"."""
    return f"{value:g} ms" if value < 1000 else f"{value / 1000:g} s"


def build_chart(report: latency.LatencyReport, measure: str, title: str) -> Chart:
    """The geometry of one chart: p50 and p95 of `measure` ("ttft" or "total") per bucket."""
    values = [getattr(b, f"{measure}_{p}") for b in report.buckets for p in ("p50", "p95")]
    y_max, y_step = nice_ceiling(max((v for v in values if v is not None), default=0.0))
    right = WIDTH - RIGHT
    return draw_chart(
        chart_id=f"chart-{measure}",
        title=title,
        since=report.since,
        until=report.until,
        buckets=report.buckets,
        lines=[
            (key, key, [getattr(b, f"{measure}_{key}") for b in report.buckets])
            for key in ("p50", "p95")
        ],
        y_max=y_max,
        y_step=y_step,
        y_label=format_axis,
        point_label=format_ms,
        legend=[
            {"key": "p50", "label": "p50 (median)", "x": right - 250, "y": 14},
            {"key": "p95", "label": "p95", "x": right - 110, "y": 14},
        ],
    )


def engine_names() -> list[str]:
    """The engines answers name in their metrics: the default one, then each row."""
    return ["default", *Engine.objects.values_list("name", flat=True)]


def _query(hours: int, include_cached: bool, engine: str = "") -> str:
    params: dict[str, int | str] = {"hours": hours}
    if include_cached:
        params["include_cached"] = "1"
    if engine:
        params["engine"] = engine
    return "?" + urlencode(params)


@require_safe
def latency_view(request):
    """GET ?hours=24&include_cached=1&engine=NAME — the latency charts of the last `hours`
    hours, of one engine's answers when `engine` names one ("default": the default engine's)."""
    user = request.user
    if not (user.is_active and user.is_staff and user.has_perm(PERMISSION)):
        raise PermissionDenied
    hours = latency.parse_hours(request.GET.get("hours", latency.DEFAULT_HOURS))
    include_cached = latency.parse_flag(request.GET.get("include_cached"))
    engines = engine_names()
    engine = request.GET.get("engine", "")
    engine = engine if engine in engines else ""
    report = latency.latency_report(hours, include_cached, engine=engine)
    totals = report.totals
    share = totals.cached_share
    context = {
        **admin.site.each_context(request),
        "title": "Answer latency",
        "opts": Message._meta,
        "report": report,
        "hours": hours,
        "include_cached": include_cached,
        "engine": engine,
        "engines": engines,
        "min_hours": latency.MIN_HOURS,
        "max_hours": latency.MAX_HOURS,
        "max_rows": latency.MAX_ROWS,
        "bucket_width": format_duration(report.width),
        "presets": [
            {
                "hours": h,
                "label": label,
                "query": _query(h, include_cached, engine),
                "current": h == hours,
            }
            for h, label in PRESET_HOURS
        ],
        "toggle_query": _query(hours, not include_cached, engine),
        "summary": {
            "ttft_p50": format_ms(totals.ttft_p50),
            "ttft_p95": format_ms(totals.ttft_p95),
            "total_p50": format_ms(totals.total_p50),
            "total_p95": format_ms(totals.total_p95),
            "cached_share": "—" if share is None else f"{share:.0%}",
        },
        "rows": [
            {
                "end": b.end,
                "count": b.count,
                "ttft_p50": format_ms(b.ttft_p50),
                "ttft_p95": format_ms(b.ttft_p95),
                "total_p50": format_ms(b.total_p50),
                "total_p95": format_ms(b.total_p95),
            }
            for b in reversed(report.buckets)
            if b.count
        ],
        "charts": []
        if report.is_empty
        else [
            build_chart(report, "ttft", "Time to first token"),
            build_chart(report, "total", "Total time"),
        ],
    }
    return TemplateResponse(request, "admin/chat/latency.html", context)


# -- how each policy behaves ----------------------------------------------------------------------


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _optional_int(raw) -> int | None:
    """A policy id or version from the query; junk means "all"."""
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def behaviour_chart(report: behaviour.BehaviourReport) -> Chart:
    """The share of each kind of answer per bucket, 0..100 %."""
    return draw_chart(
        chart_id="chart-behaviour",
        title="Share of finished answers",
        since=report.since,
        until=report.until,
        buckets=report.buckets,
        lines=[
            (kind, behaviour.LABELS[kind], [b.counts.share(kind) for b in report.buckets])
            for kind in behaviour.KINDS
        ],
        y_max=1.0,
        y_step=0.25,
        y_label=lambda value: f"{value:.0%}",
        point_label=_share,
        legend=[],  # seven lines: the legend is the page's list under the chart
    )


@require_safe
def behaviour_view(request):
    """GET ?hours=24&policy=ID&version=N&engine=NAME — how each policy's answers ended, and
    over time (one engine's answers when `engine` names one)."""
    user = request.user
    if not (user.is_active and user.is_staff and user.has_perm(PERMISSION)):
        raise PermissionDenied
    hours = latency.parse_hours(request.GET.get("hours", latency.DEFAULT_HOURS))
    policy_id = _optional_int(request.GET.get("policy"))
    version = _optional_int(request.GET.get("version")) if policy_id is not None else None
    engines = engine_names()
    engine = request.GET.get("engine", "")
    engine = engine if engine in engines else ""
    report = behaviour.behaviour_report(hours, policy_id=policy_id, version=version, engine=engine)
    rated = feedback_by_version(report.since, report.until)
    names = OutputPolicy.objects.in_bulk([pid for pid, _ in report.versions if pid is not None])

    def name_of(pid: int | None) -> str:
        policy = names.get(pid) if pid is not None else None
        return policy.name if policy is not None else ("no policy" if pid is None else "deleted")

    def query(**params) -> str:
        return "?" + urlencode(
            {
                k: v
                for k, v in {"hours": hours, "engine": engine or None, **params}.items()
                if v is not None
            }
        )

    selected = "all policies"
    if policy_id is not None:
        selected = name_of(policy_id) + ("" if version is None else f" v{version}")
    context = {
        **admin.site.each_context(request),
        "title": "How each policy behaves",
        "opts": Message._meta,
        "report": report,
        "hours": hours,
        "policy_id": policy_id,
        "version": version,
        "engine": engine,
        "engines": engines,
        "selected": selected,
        "min_hours": latency.MIN_HOURS,
        "max_hours": latency.MAX_HOURS,
        "max_rows": latency.MAX_ROWS,
        "bucket_width": format_duration(report.width),
        "kinds": [{"key": k, "label": behaviour.LABELS[k]} for k in behaviour.KINDS],
        "presets": [
            {
                "label": label,
                "query": query(hours=h, policy=policy_id, version=version),
                "current": h == hours,
            }
            for h, label in PRESET_HOURS
        ],
        "all_query": query(),
        "finished": report.totals.finished,
        "totals": [
            {"key": k, "label": behaviour.LABELS[k], "share": _share(report.totals.share(k))}
            for k in behaviour.KINDS
        ],
        "versions": [
            {
                "name": name_of(pid),
                "version": "—" if pversion is None else pversion,
                "query": query(policy=pid, version=pversion) if pid is not None else None,
                "policy_query": query(policy=pid) if pid is not None else None,
                "current": pid == policy_id and (version is None or version == pversion),
                "finished": counts.finished,
                "cancelled": counts.cancelled,
                "failed": counts.failed,
                "shares": [_share(counts.share(k)) for k in behaviour.KINDS],
                "feedback": rated.get((pid, pversion), FeedbackCounts()),
            }
            for (pid, pversion), counts in report.versions.items()
        ],
        "rows": [
            {
                "end": b.end,
                "count": b.counts.finished,
                "shares": [_share(b.counts.share(k)) for k in behaviour.KINDS],
            }
            for b in reversed(report.buckets)
            if b.counts.finished
        ],
        "chart": None if report.is_empty else behaviour_chart(report),
    }
    return TemplateResponse(request, "admin/chat/behaviour.html", context)
