"""The profile page: unix username, time zone, reminders, personal API tokens, and the parts other apps add
(accounts/profile_parts.py: calendar feeds).

A new token is shown once, on the response to the form that created it (marked no-store); it is
never put in the session, in a message or in a redirect, and the database keeps only its hash.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_http_methods, require_POST

from accounts.forms import ProfileForm, TokenForm
from accounts.http import AuthenticatedHttpRequest
from accounts.models import ApiToken, User
from accounts.profile_parts import profile_parts
from accounts.services import (
    UnixUsernameError,
    api_token_create,
    api_token_revoke,
    unix_username_confirm,
    unix_username_refuse,
    unix_username_request,
    user_profile_update,
    who_sets_unix_usernames,
)
from kernel.page_parts import assets


@login_required
@require_http_methods(["GET", "POST"])
def profile(request: AuthenticatedHttpRequest) -> HttpResponse:
    # A fresh copy: a form that fails validation must not leave its values on request.user.
    user = User.objects.get(pk=request.user.pk)
    if request.method != "POST":
        return _render(request, ProfileForm(instance=user))
    form = ProfileForm(request.POST, instance=user)
    if form.is_valid():
        if not form.has_changed():
            messages.info(request, "Nothing to save: your profile is as it was.")
            return redirect("profile")
        if _save_profile(form, actor=request.user):
            messages.success(request, f"Profile saved: {_describe(form)}.")
            return redirect("profile")
    return _render(request, form)


def _save_profile(form: ProfileForm, *, actor: Any) -> bool:
    """Save through the services; False (with the reason on the field) if the unix username is
    refused. The other settings are saved only when it is not, so nothing is half-saved."""
    asked = form.unix_username_asked()
    if asked is not None:
        try:
            unix_username_request(user=form.instance, name=asked, actor=actor)
        except UnixUsernameError as error:
            form.add_error("unix_username_requested", str(error))
            return False
    user_profile_update(user=form.instance, changes=form.profile_changes(), actor=actor)
    return True


_LABELS = {"timezone": "time zone", "remind_before_end_minutes": "reminder"}


def _describe(form: ProfileForm) -> str:
    parts = []
    for name in form.changed_data:
        value = form.cleaned_data[name]
        if name != "unix_username_requested":
            parts.append(f"{_LABELS[name]} {value}")
        elif form.instance.unix_username_requested:
            parts.append(f"unix username {value.strip()} requested: an admin confirms it before any GPU opens for it")
        else:
            parts.append("unix username request withdrawn")
    return ", ".join(parts)


@login_required
@require_POST
def token_create(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = TokenForm(request.POST)
    if form.is_valid():
        days = form.cleaned_data["expires_in_days"]
        expires_at = timezone.now() + timedelta(days=days) if days else None
        try:
            record, token = api_token_create(user=request.user, name=form.cleaned_data["name"], expires_at=expires_at)
        except ValueError as exc:
            form.add_error(None, str(exc))
        else:
            # The only time the token exists outside the user's hands: this response, not cached.
            response = _render(request, ProfileForm(instance=request.user), TokenForm(), new_token=(record, token))
            add_never_cache_headers(response)
            return response
    return _render(request, ProfileForm(instance=request.user), form)


@login_required
@require_POST
def token_revoke(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    if token.revoked_at is not None:
        messages.info(request, f"Token “{token.name}” was already revoked.")
    else:
        api_token_revoke(token=token, actor=request.user)
        messages.success(request, f"Token “{token.name}” ({token.prefix}…) revoked; requests that use it now fail.")
    return redirect("profile")


def _render(
    request: AuthenticatedHttpRequest,
    profile_form: ProfileForm,
    token_form: TokenForm | None = None,
    *,
    new_token: tuple[ApiToken, str] | None = None,
) -> HttpResponse:
    now = timezone.now()
    tokens = [(token, token.state(now)) for token in ApiToken.objects.filter(user=request.user)]
    parts = profile_parts.shown(request=request)
    context = {
        "nav": "profile",
        "form": profile_form,
        "token_form": token_form or TokenForm(),
        "tokens": tokens,
        "new_token": new_token,
        "me_url": request.build_absolute_uri(reverse("api:me")),
        "parts": parts,
        "part_assets": assets(parts),
        "who_sets_unix_usernames": who_sets_unix_usernames(),
    }
    return render(request, "accounts/profile.html", context)


@login_required
@require_POST
def unix_username_decide(request: AuthenticatedHttpRequest, pk: int, decision: str) -> HttpResponse:
    """An admin confirms or refuses a person's unix username request (the approvals page)."""
    if decision not in ("confirm", "refuse"):
        raise Http404(f"No decision {decision!r}.")
    if not request.user.is_booking_admin:
        return HttpResponseForbidden("Only admins confirm unix usernames.")
    user = get_object_or_404(User, pk=pk)
    name = request.POST.get("name", "")
    try:
        if decision == "confirm":
            unix_username_confirm(user=user, name=name, actor=request.user)
            messages.success(request, f"{user.get_username()}'s unix username is now {name}: their GPUs open for it.")
        else:  # refuse
            unix_username_refuse(user=user, actor=request.user, reason=request.POST.get("reason", ""), name=name)
            messages.success(request, f"{user.get_username()}'s request for {name!r} refused.")
    except UnixUsernameError as error:
        messages.error(request, f"{user.get_username()}: {error}")
    return redirect(f"{reverse('pending-approvals')}#unix-usernames-h")
