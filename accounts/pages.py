"""The profile pages: unix username, time zone, reminders, API tokens. (Being written.)"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST


@login_required
def profile(request: HttpRequest) -> HttpResponse:
    return render(request, "accounts/profile.html", {"nav": "profile"})


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    raise NotImplementedError


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    raise NotImplementedError
