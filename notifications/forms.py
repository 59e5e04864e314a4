from __future__ import annotations

from django import forms

from notifications.models import MailPreferences


class MailPreferencesForm(forms.ModelForm):
    class Meta:
        model = MailPreferences
        fields = ("booking_received", "decisions", "slot_starting", "slot_ending", "slot_ended", "approval_requests")
