"""Forms of the profile page: the user's settings and new API tokens."""

from __future__ import annotations

from functools import cache
from typing import Any
from zoneinfo import available_timezones

from django import forms

from accounts.models import User

REMIND_MAX_MINUTES = 240


@cache
def timezone_names() -> tuple[str, ...]:
    """Every IANA zone the server knows, sorted (read from disk once per process)."""
    return tuple(sorted(name for name in available_timezones() if name not in {"localtime", "Factory"}))


class ProfileForm(forms.ModelForm):
    """Unix username (set once by the user, then only by an admin), time zone and reminders."""

    remind_before_end_minutes = forms.IntegerField(
        label="Reminder before a slot ends (minutes)",
        min_value=0,
        max_value=REMIND_MAX_MINUTES,
        help_text=f"An email this many minutes before the end, 0 to {REMIND_MAX_MINUTES}; 0 means no reminder.",
    )

    class Meta:
        model = User
        fields = ["unix_username", "timezone", "remind_before_end_minutes"]
        labels = {"unix_username": "Unix username", "timezone": "Time zone"}
        help_texts = {
            "unix_username": "The account on the GPU nodes that gets your booked GPUs, as you log in with ssh. "
            "You can set it once; after that only an admin can change it.",
            "timezone": "Pages and emails show times in this zone.",
        }
        error_messages = {
            "unix_username": {
                "unique": "Another portal account already has this unix username. If it is yours, ask an admin.",
            },
        }
        widgets = {"timezone": forms.Select}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = timezone_names()
        current = self.instance.timezone
        choices = names if current in names or not current else (current, *names)
        self.fields["timezone"].widget.choices = [(name, name) for name in choices]
        if self.instance.unix_username:
            # It names the account that receives GPUs on the nodes: once set, admins change it.
            field = self.fields["unix_username"]
            field.disabled = True
            field.help_text = "It names your account on the GPU nodes; ask an admin to change it."

    @property
    def unix_username_locked(self) -> bool:
        return self.fields["unix_username"].disabled


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
