"""The admin's usage page (/admin/usage/): spending by user, key, policy, engine and UTC day,
with charts drawn like the latency page's, and the same rows as CSV. A user's own page is
chat/pages/usage_page.py."""

from __future__ import annotations

import csv
from datetime import UTC, datetime, time

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.template.response import TemplateResponse
from django.views.decorators.http import require_safe

from ..models import Usage
from ..stores.usage import UsageReport, usage_report
from .charts import RIGHT, WIDTH, draw_chart, nice_ceiling

PRESET_DAYS = (7, 30, 90)
PERMISSION = "chat.view_usage"
CSV_COLUMNS = (
    "day",
    "user",
    "key",
    "policy",
    "engine",
    "tokens",
    "answers",
    "prompt_tokens",
    "cached_answers",
)


def _chart(report: UsageReport, measure: str, title: str):
    values = [getattr(day, measure) for day in report.days]
    y_max, y_step = nice_ceiling(max(values, default=0))
    if y_step < 1:  # counts: whole-number ticks
        y_step = 1.0
        y_max = float(max(1, max(values, default=0)))
    return draw_chart(
        chart_id=f"chart-{measure}",
        title=title,
        since=datetime.combine(report.since, time.min, UTC),
        until=report.days[-1].end,
        buckets=report.days,
        lines=[("p50", measure, [float(v) for v in values])],
        y_max=y_max,
        y_step=y_step,
        y_label=lambda value: f"{value:g}",
        point_label=lambda value: f"{value:g} {measure}",
        legend=[
            {"key": "p50", "label": f"{measure} per UTC day", "x": WIDTH - RIGHT - 200, "y": 14}
        ],
    )


def _days(raw) -> int:
    try:
        return max(1, min(366, int(raw)))
    except (TypeError, ValueError):
        return 30


@require_safe
def admin_usage_view(request):
    """GET ?days=30&user=NAME&key=PREFIX&policy=SLUG&engine=NAME[&format=csv]: spending by
    user, key, policy, engine and UTC day; the same rows as CSV with format=csv."""
    user = request.user
    if not (user.is_active and user.is_staff and user.has_perm(PERMISSION)):
        raise PermissionDenied
    days = _days(request.GET.get("days", 30))
    filters = {
        "username": request.GET.get("user", "").strip(),
        "key_prefix": request.GET.get("key", "").strip().rstrip("…"),
        "policy": request.GET.get("policy", "").strip(),
    }
    engine = request.GET.get("engine", "").strip()
    # "default" is the default engine's rows (stored with no name); empty: every engine.
    report = usage_report(
        days=days, engine=("" if engine == "default" else engine) if engine else None, **filters
    )
    if request.GET.get("format") == "csv":
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="usage-{report.until}.csv"'
        writer = csv.writer(response)
        writer.writerow(CSV_COLUMNS)
        for row in report.rows:
            writer.writerow([_csv_cell(row[column]) for column in CSV_COLUMNS])
        return response
    query = request.GET.copy()
    query["format"] = "csv"
    context = {
        **admin.site.each_context(request),
        "title": "Usage",
        "opts": Usage._meta,
        "report": report,
        "days": days,
        "filters": {
            "user": filters["username"],
            "key": filters["key_prefix"],
            "policy": filters["policy"],
            "engine": engine,
        },
        "presets": [{"days": d, "current": d == days} for d in PRESET_DAYS],
        "csv_query": query.urlencode(),
        "charts": []
        if report.is_empty
        else [
            _chart(report, "tokens", "Tokens generated per day"),
            _chart(report, "answers", "Answers generated per day"),
        ],
    }
    return TemplateResponse(request, "admin/chat/usage.html", context)


def _csv_cell(value):
    """A cell a spreadsheet shows as written: a leading =, +, - or @ would be run as a formula."""
    text = str(value)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@") else value
