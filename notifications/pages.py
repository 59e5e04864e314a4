"""The page where each person chooses which mails they get."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from notifications.forms import MailPreferencesForm
from notifications.services import preferences_of


@login_required
def mail_preferences(request: HttpRequest) -> HttpResponse:
    user: Any = request.user
    form = MailPreferencesForm(request.POST or None, instance=preferences_of(user))
    if not user.is_booking_admin:
        del form.fields["approval_requests"]
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, "Your mail choices are saved.")
        return redirect("mail-preferences")
    return render(request, "notifications/preferences.html", {"nav": "profile", "form": form})
