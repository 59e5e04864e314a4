"""Input of the reservation pages' small action forms: shape only, the services decide the rest."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS

from kernel.fields import moment_problem, validate_moment
from reservations.exceptions import InvalidBooking

EXTEND_HOURS = (1, 2, 4)
REASON_MAX_LENGTH = 1000


class ExtendForm(forms.Form):
    """Either ``hours`` to add to the current end, or a new ``end`` (datetime-local, in the user's zone).

    The page has one small form for each; a post carrying both uses the explicit end.
    """

    hours = forms.TypedChoiceField(
        label="Extend by",
        choices=[(str(h), f"+{h} h") for h in EXTEND_HOURS],
        coerce=int,
        required=False,
        error_messages={"invalid_choice": "Choose +1, +2 or +4 hours."},
    )
    # Django reads "2030-01-07T12:00" (what datetime-local sends) in the active time zone, which
    # the middleware sets to the user's: so the new end means what the user saw on the page.
    end = forms.DateTimeField(
        label="New end",
        required=False,
        error_messages={"invalid": "Enter the new end as a date and time, like 2030-01-07 14:00."},
        validators=[validate_moment],
    )

    def clean(self) -> dict[str, Any]:
        super().clean()  # returns cleaned_data, which the stubs type as optional
        data = self.cleaned_data
        if not self.errors and data.get("end") is None and data.get("hours") in (None, ""):
            raise forms.ValidationError("Choose how many hours to add, or enter a new end.")
        return data

    def new_end(self, current_end: datetime) -> datetime:
        if self.cleaned_data.get("end") is not None:
            return self.cleaned_data["end"]
        # The current end is the database's: one written before the portal kept to its calendar
        # (kernel/fields.py) could be so late that adding hours overflows. Refuse it in words.
        if moment_problem(current_end):
            raise InvalidBooking("This booking ends outside the dates the portal takes: it cannot be extended.")
        return current_end + timedelta(hours=self.cleaned_data["hours"])


class ReasonForm(forms.Form):
    reason = forms.CharField(label="Reason", required=False, max_length=REASON_MAX_LENGTH)


class RequiredReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        max_length=REASON_MAX_LENGTH,
        error_messages={"required": "Give a reason for the rejection: the researcher will read it."},
    )


def first_error(form: forms.Form) -> str:
    """One line naming the field and the problem, for a flash message."""
    for name, errors in form.errors.items():
        if name == NON_FIELD_ERRORS:
            return str(errors[0])
        return f"{form.fields[name].label}: {errors[0]}"
    return "The form could not be read."
