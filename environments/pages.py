"""The booking page's forms for environments: launch one, stop one. They come back to the page they were on."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_POST

from accounts.http import AuthenticatedHttpRequest
from environments import services
from environments.selectors import ID_RE, environments_offered, launches_visible
from kernel.api import DomainError
from reservations import selectors
from reservations.pages import back_to_next


@login_required
@require_POST
def launch_create_page(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    # Someone else's booking is a 404, as everywhere; an admin looking at it is refused by the service, in words.
    reservation = get_object_or_404(selectors.reservations_actionable(user=request.user), pk=pk)
    chosen = request.POST.get("environment", "")
    offered = environments_offered()
    environment = offered.filter(pk=int(chosen)).first() if ID_RE.fullmatch(chosen) else None
    if environment is None:
        messages.error(request, "Pick one of the environments listed.")
        return back_to_next(request)
    try:
        launch = services.launch_create(user=request.user, reservation=reservation, environment=environment)
    except DomainError as error:
        messages.error(request, str(error))
    else:
        when = "now" if reservation.start <= launch.requested_at else "when the slot starts"
        messages.success(request, f"{environment.name} will start on {reservation.node.name} {when}.")
    return back_to_next(request)


@login_required
@require_POST
def launch_stop_page(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    launch = get_object_or_404(launches_visible(user=request.user), pk=pk)
    try:
        services.launch_stop(actor=request.user, launch=launch)
    except DomainError as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"{launch.environment.name} is being stopped, with everything it started.")
    return back_to_next(request)
