"""Typed readers for settings that come from environment variables.

Every setting has an embedded default so the portal runs with nothing configured. A secret may
also be given as ``<NAME>_FILE`` (a path), the convention of Docker secrets and systemd
credentials, so it never has to sit in the environment.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from kernel.deployment import placeholder_names, placeholder_refusal

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envstr(name: str, default: str = "") -> str:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        value = Path(file_path).read_text().strip()
        # The environment itself is looked at once, by settings; a secret's file only here.
        if placeholder_names({f"{name}_FILE": value}):
            raise ImproperlyConfigured(placeholder_refusal([f"{name}_FILE ({file_path})"]))
        return value
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off.")


def envint(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number.") from None


def envfloat(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number.")
    return value


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def envchoice(name: str, default: str, choices: list[str] | tuple[str, ...]) -> str:
    """One of a fixed set of words (``envstr``); anything else stops the portal and names them."""
    value = envstr(name, default)
    if value not in choices:
        words = f"{choices[0]} or {choices[1]}" if len(choices) == 2 else f"one of {', '.join(choices)}"
        raise ImproperlyConfigured(f"{name}={value!r}: use {words}.")
    return value
