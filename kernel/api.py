"""API plumbing shared by every app: one error shape, also for URLs no view matches.

Every error the API returns looks like::

    {"error": {"code": "slot_conflict", "message": "Slot taken: ...", "details": {...}}}

``code`` is for programs, ``message`` is for people, ``details`` says which slots, limits or fields.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import bad_request as default_bad_request
from django.views.defaults import page_not_found
from django.views.defaults import server_error as default_server_error
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class DomainError(Exception):
    """An error of an app's own rules (a booking refused, ...) that the API answers with ``http_status``,
    ``code`` and the message and details a person can act on. Apps subclass it; the kernel never needs
    to know their classes (reservations/exceptions.py)."""

    code = "error"
    http_status: int = status.HTTP_400_BAD_REQUEST
    retry_after: str | None = None  # seconds, for an error that retrying soon cures

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _flatten(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {key: _flatten(value) for key, value in detail.items()}
    if isinstance(detail, list):
        return [_flatten(item) for item in detail]
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        refusal = Response(error_body(exc.code, exc.message, exc.details), status=exc.http_status)
        if exc.retry_after:
            refusal["Retry-After"] = exc.retry_after
        return refusal
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail) if isinstance(exc.detail, dict) else {"non_field_errors": _flatten(exc.detail)}
        problems = "; ".join(
            f"{name}: {' '.join(msgs) if isinstance(msgs, list) and all(isinstance(m, str) for m in msgs) else msgs}"
            for name, msgs in fields.items()
        )
        response.data = error_body("invalid", f"Invalid input — {problems}", {"fields": fields})
    elif isinstance(exc, exceptions.APIException):
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else "error"
        response.data = error_body(str(code), str(exc.detail))
    else:  # Http404 or PermissionDenied from Django, already mapped to a status by DRF
        code = {404: "not_found", 403: "permission_denied"}.get(response.status_code, "error")
        message = "Not found." if response.status_code == 404 else "You do not have permission to do this."
        response.data = error_body(code, message)
    return response


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for a URL that matches no route: JSON under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    return page_not_found(request, exception or Http404())


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("bad_request", "The request could not be read."), status=400)
    return default_bad_request(request, exception or Exception())


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(
            error_body("server_error", "Something went wrong on our side; it has been logged."), status=500
        )
    return default_server_error(request)
