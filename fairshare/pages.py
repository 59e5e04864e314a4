"""Fair share on pages: your own factor on your profile, everyone's for the admins (/fairshare/)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone

from accounts.http import AuthenticatedHttpRequest
from fairshare.factors import fairshare_for, fairshare_table


def profile_section(*, request: AuthenticatedHttpRequest) -> dict[str, Any]:
    """What templates/fairshare/profile_section.html shows: the person's own factor and why."""
    mine = fairshare_for([request.user.pk], now=timezone.now())[request.user.pk]
    return {"fair_share": mine}


@login_required
def fairshare_page(request: AuthenticatedHttpRequest) -> HttpResponse:
    if not request.user.is_booking_admin:
        return render(request, "fairshare/table.html", {"nav": "fairshare", "forbidden": True}, status=403)
    return render(request, "fairshare/table.html", {"nav": "fairshare", "rows": fairshare_table(now=timezone.now())})
