"""An exclusion constraint that exists on PostgreSQL and is a no-op elsewhere.

The embedded default database is SQLite, which has no exclusion constraints; there the booking
service's check runs inside a write-serialized (BEGIN IMMEDIATE) transaction instead. Keeping the
constraint in ``Meta.constraints`` (rather than hidden in raw SQL) keeps it visible next to the
model and in migration state.
"""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, IntegerRangeField
from django.db.models import Func


class TsTzRange(Func):
    function = "TSTZRANGE"
    output_field = DateTimeRangeField()


class Int4Range(Func):
    function = "INT4RANGE"
    output_field = IntegerRangeField()


class PostgresExclusionConstraint(ExclusionConstraint):
    @staticmethod
    def _is_postgres(schema_editor: Any) -> bool:
        return schema_editor.connection.vendor == "postgresql"

    def constraint_sql(self, model: Any, schema_editor: Any) -> Any:
        return super().constraint_sql(model, schema_editor) if self._is_postgres(schema_editor) else None

    def create_sql(self, model: Any, schema_editor: Any) -> Any:
        return super().create_sql(model, schema_editor) if self._is_postgres(schema_editor) else None

    def remove_sql(self, model: Any, schema_editor: Any) -> Any:
        return super().remove_sql(model, schema_editor) if self._is_postgres(schema_editor) else None

    def validate(self, model: Any, instance: Any, exclude: Any = None, using: str = "default") -> None:
        from django.db import connections

        if connections[using].vendor == "postgresql":
            super().validate(model, instance, exclude=exclude, using=using)
