"""The reports page and its CSV download (the same figures as GET /api/v1/reports/...)."""

from __future__ import annotations

import csv
from datetime import date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from accounting.api import DEFAULT_DAYS, demand_payload, report_payload
from accounting.report import DIMENSIONS
from kernel.fields import validate_day

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
DIMENSION_LABELS = {"user": "Person", "group": "Group", "node": "Node", "gpu": "GPU"}
CSV_COLUMNS = (
    ("label", "name"),
    ("bookings", "bookings"),
    ("booked_gpu_hours", "booked GPU-hours"),
    ("used_gpu_hours", "used GPU-hours"),
    ("unmeasured_gpu_hours", "unmeasured GPU-hours"),
    ("efficiency", "efficiency"),
    ("released_early", "released early"),
    ("no_shows", "no-shows"),
    ("no_show_gpu_hours", "no-show GPU-hours"),
    ("energy_kwh", "energy kWh"),
    ("idle_energy_kwh", "idle energy kWh"),
    ("energy_estimated", "energy estimated"),
    ("cost", "cost"),
    ("co2_kg", "CO2e kg"),
    ("idle_node_hours", "fully idle node-hours"),
)


class PeriodForm(forms.Form):
    """Whole days in the reader's zone: from the first day's midnight to the day after the last."""

    # validate_day: a day near the calendar's edge overflows once read as midnight in the reader's
    # zone or moved by a day (kernel/fields.py).
    start = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), validators=[validate_day])
    end = forms.DateField(
        widget=forms.DateInput(attrs={"type": "date"}), label="Until (inclusive)", validators=[validate_day]
    )
    by = forms.ChoiceField(choices=[(d, DIMENSION_LABELS[d]) for d in DIMENSIONS], initial="user", label="Rows")

    def clean(self) -> dict[str, Any]:
        super().clean()  # returns cleaned_data, which the stubs type as optional
        data = self.cleaned_data
        start, end = data.get("start"), data.get("end")
        if start and end:
            if end < start:
                raise forms.ValidationError("The last day comes before the first: swap them.")
            if (end - start).days + 1 > settings.REPORT_MAX_DAYS:
                raise forms.ValidationError(f"A report covers at most {settings.REPORT_MAX_DAYS} days.")
        return data


def _midnight(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time()), timezone.get_current_timezone())


def _period(request: HttpRequest) -> tuple[PeriodForm, dict[str, Any] | None]:
    """The form (the last 30 days by person unless the query says otherwise) and, when it is
    valid, the period as aware datetimes and the dimension."""
    today = timezone.localdate()
    defaults = {"start": str(today - timedelta(days=DEFAULT_DAYS - 1)), "end": str(today), "by": "user"}
    form = PeriodForm(defaults | request.GET.dict())
    if not form.is_valid():
        return form, None
    data = form.cleaned_data
    start, end = _midnight(data["start"]), _midnight(data["end"] + timedelta(days=1))
    return form, {"start": start, "end": end, "by": data["by"]}


@login_required
def report_page(request: HttpRequest) -> HttpResponse:
    form, period = _period(request)
    context: dict[str, Any] = {"nav": "reports", "form": form, "period": period, "weekdays": WEEKDAYS}
    context["zone"] = timezone.get_current_timezone_name()
    if period is not None:
        report = report_payload(viewer=request.user, **period)
        demand = demand_payload(
            start=period["start"], end=period["end"], zone=timezone.get_current_timezone_name(), viewer=request.user
        )
        context |= {
            "report": report,
            "dimension": DIMENSION_LABELS[period["by"]],
            "csv_url": "usage.csv?" + urlencode({k: form.data[k] for k in ("start", "end", "by")}),
            "show_idle_nodes": period["by"] == "node" and report["idle_node_hours"] is not None,
            "by_node_link": None
            if period["by"] == "node"
            else "?" + urlencode({k: form.data[k] for k in ("start", "end")} | {"by": "node"}),
            "charts": {
                "rows": report["rows"][:30],
                "demand": demand["hours"],
                "peak": demand["peak"],
                "dimension": DIMENSION_LABELS[period["by"]],
            },
        }
    return render(request, "accounting/report.html", context, status=200 if period else 400)


@login_required
def report_csv(request: HttpRequest) -> HttpResponse:
    form, period = _period(request)
    if period is None:
        errors = "; ".join(str(e) for errors in form.errors.values() for e in errors)
        return HttpResponse(f"Bad period: {errors}\n", status=400, content_type="text/plain; charset=utf-8")
    report = report_payload(viewer=request.user, **period)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"gpu-usage-by-{period['by']}-{form.cleaned_data['start']}-{form.cleaned_data['end']}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerow([DIMENSION_LABELS[period["by"]].lower()] + [title for _, title in CSV_COLUMNS[1:]])
    for row in report["rows"]:
        writer.writerow([_cell(row[key]) for key, _ in CSV_COLUMNS])
    return response


def _cell(value: Any) -> Any:
    # A name starting with = + - @ would be a formula to a spreadsheet: quote it as text.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return "" if value is None else value
