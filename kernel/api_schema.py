"""The error responses every endpoint documents in the OpenAPI schema."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable: invalid, slot_conflict, limit_exceeded, ...")
    message = serializers.CharField(help_text="What went wrong, in words a person can act on.")
    details = serializers.DictField(help_text="Which slots, limits or fields.")


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


def error_response(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


ERRORS = {
    400: error_response("Bad input: the fields and what is wrong with them."),
    401: error_response("Not logged in, or an unknown, revoked or expired token."),
    403: error_response("Not allowed, or a limit refuses it (the limit and the numbers)."),
    404: error_response("No such object, or not one you may act on."),
    409: error_response("The slot is taken (the conflicting slots), or the reservation's state does not allow it."),
    429: error_response("Too many requests for this token."),
    503: error_response(
        "Retry after Retry-After seconds: the GPUs are busy with other bookings (busy), or the database or Redis is "
        "away or busy (database_restarting, database_unavailable, ...; docs/api.md, 'Errors during an outage')."
    ),
}
READ_ERRORS = {code: ERRORS[code] for code in (400, 401, 404, 429, 503)}
