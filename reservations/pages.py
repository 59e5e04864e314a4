"""Server-rendered reservation pages: my reservations, pending approvals, and their actions. (Being written.)"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST


@login_required
def my_reservations(request: HttpRequest) -> HttpResponse:
    return render(request, "reservations/mine.html", {"nav": "mine"})


@login_required
def pending_approvals(request: HttpRequest) -> HttpResponse:
    return render(request, "reservations/pending.html", {"nav": "pending"})


@login_required
@require_POST
def reservation_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    raise NotImplementedError
