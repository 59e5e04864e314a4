"""The booking calendar page and the data it loads per visible range. (Being written.)"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def calendar_page(request: HttpRequest) -> HttpResponse:
    return render(request, "reservations/calendar.html", {"nav": "calendar"})
