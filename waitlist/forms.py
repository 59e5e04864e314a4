"""The waitlist page's join form: shape only, waitlist/services.py decides the rest."""

from __future__ import annotations

from typing import Any

from django import forms

from kernel.fields import validate_moment
from nodes.models import Gpu, Node

DURATIONS = [
    (minutes, f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min")
    for minutes in (15, 30, 60, 120, 180, 240, 360, 480, 720, 1440)
]


LOCAL_TIME = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


class JoinForm(forms.Form):
    """These GPUs, or any ``count`` on a node; a window and a duration. Times (datetime-local) are read in the
    user's zone, which the middleware activates."""

    gpus = forms.ModelMultipleChoiceField(
        queryset=Gpu.objects.select_related("node").order_by("node__name", "index", "placement_start"),
        required=False,
        label="These GPUs",
        help_text="Or leave empty and choose a node and how many.",
    )
    node = forms.ModelChoiceField(queryset=Node.objects.order_by("name"), required=False, label="Any GPUs on node")
    count = forms.IntegerField(min_value=1, max_value=64, initial=1, required=False, label="How many")
    earliest_start = forms.DateTimeField(label="From", validators=[validate_moment], widget=LOCAL_TIME)
    latest_end = forms.DateTimeField(label="Until", validators=[validate_moment], widget=LOCAL_TIME)
    duration = forms.TypedChoiceField(choices=DURATIONS, coerce=int, initial=120, label="For")
    auto_book = forms.BooleanField(
        required=False,
        initial=True,
        label="Book it for me at once when it comes free",
        help_text="Otherwise the slot is held for you and you have a few minutes to claim it.",
    )
    purpose = forms.CharField(required=False, max_length=500, label="Purpose")

    def clean(self) -> dict[str, Any]:
        super().clean()  # returns cleaned_data, which the stubs type as optional
        data = self.cleaned_data
        if not self.errors and not data.get("gpus") and not data.get("node"):
            raise forms.ValidationError("Choose the GPUs, or a node and how many.")
        return data
