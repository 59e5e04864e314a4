"""Forms of the profile page: the user's settings and new API tokens."""

from __future__ import annotations

from functools import cache
from typing import Any
from zoneinfo import available_timezones

from django import forms
from django.conf import settings

from accounts.models import User

REMIND_MAX_MINUTES = 240


@cache
def timezone_names() -> tuple[str, ...]:
    """Every IANA zone the server knows, sorted (read from disk once per process)."""
    return tuple(sorted(name for name in available_timezones() if name not in {"localtime", "Factory"}))


class ProfileForm(forms.ModelForm):
    """Time zone and reminders; with UNIX_USERNAME_SOURCE=request also the unix username the person
    asks for (an admin confirms it: accounts.services.unix_username_request)."""

    remind_before_end_minutes = forms.IntegerField(
        label="Reminder before a slot ends (minutes)",
        min_value=0,
        max_value=REMIND_MAX_MINUTES,
        help_text=f"An email this many minutes before the end, 0 to {REMIND_MAX_MINUTES}; 0 means no reminder.",
    )
    unix_username_requested = forms.CharField(
        label="Unix username",
        required=False,
        max_length=32,
        help_text="The account on the GPU nodes that gets your booked GPUs, as you log in with ssh. "
        "An admin confirms each new name (and each change) before any GPU opens for it.",
    )

    class Meta:
        model = User
        fields = ["timezone", "remind_before_end_minutes"]
        labels = {"timezone": "Time zone"}
        help_texts = {"timezone": "Pages and emails show times in this zone."}
        widgets = {"timezone": forms.Select}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = timezone_names()
        current = self.instance.timezone
        choices = names if current in names or not current else (current, *names)
        self.fields["timezone"].widget.choices = [(name, name) for name in choices]
        if self.requests_unix_username and (not self.is_bound or "unix_username_requested" in self.data):
            # Shown as what stands: the request waiting for an admin, else the confirmed name.
            self.fields["unix_username_requested"].initial = (
                self.instance.unix_username_requested or self.instance.unix_username or ""
            )
        else:
            del self.fields["unix_username_requested"]

    @property
    def requests_unix_username(self) -> bool:
        return settings.UNIX_USERNAME_SOURCE == "request"

    def unix_username_asked(self) -> str | None:
        """The name to request after a valid POST, or None when the field did not change."""
        if not self.requests_unix_username or "unix_username_requested" not in self.changed_data:
            return None
        return self.cleaned_data["unix_username_requested"].strip()

    def profile_changes(self) -> dict[str, Any]:
        return {name: self.cleaned_data[name] for name in self.changed_data if name in self.Meta.fields}


class TokenForm(forms.Form):
    name = forms.CharField(
        label="Token name",
        max_length=100,
        help_text="What will use it, so you can tell your tokens apart: “laptop”, “nightly sweep”.",
    )
    expires_in_days = forms.IntegerField(
        label="Expires after (days, optional)",
        min_value=1,
        max_value=3650,
        required=False,
        help_text="Leave empty for a token that works until you revoke it.",
    )
