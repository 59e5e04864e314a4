"""Deployment mistakes the portal refuses, as rules that the settings (at import) and the system checks
(portal/checks.py) share, so each is written once (docs/security.md, "Refused at start").

- A value copied from deploy/portal.env.example and never filled in: its secrets all begin with
  ``replace-with-``, which anybody who has read the example knows.
- A SECRET_KEY that can be guessed: Django's own rule (its deployment check security.W009), which
  here stops every process, because every calendar feed URL and session is signed with it.
- Which host names are this machine's: DEBUG is for those only, and a portal that names nothing else
  is a trial on one machine (the demo, a laptop), where https cannot be asked for.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)

PLACEHOLDER = "replace-with-"
# How to make one: commands, not secrets.
GENERATE_SECRET = "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"  # noqa: S105
GENERATE_PASSWORD = "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"  # noqa: S105


def placeholder_names(environ: Mapping[str, str]) -> list[str]:
    """The variables whose value still holds an example's placeholder, in order. A URL counts too: DATABASE_URL
    carries POSTGRES_PASSWORD's placeholder once Compose has put it in."""
    return sorted(name for name, value in environ.items() if PLACEHOLDER in value)


def placeholder_refusal(names: Iterable[str]) -> str:
    names = list(names)
    verb = "still holds a placeholder" if len(names) == 1 else "still hold placeholders"
    return (
        f"{', '.join(names)} {verb} from deploy/portal.env.example ({PLACEHOLDER}...), which "
        "anybody who has read the example knows. Generate each secret and put it in .env (or the environment): "
        f"SECRET_KEY with {GENERATE_SECRET}, each password with {GENERATE_PASSWORD}; the URLs that carry a "
        "password (DATABASE_URL, REDIS_URL, NODE_BROKER_URL) take it from there."
    )


def secret_key_weakness(key: str) -> str | None:
    """Why ``key`` is not good enough as SECRET_KEY, in words, or None. Django's rule (security.W009)."""
    if key.startswith(SECRET_KEY_INSECURE_PREFIX):
        return f"it begins with {SECRET_KEY_INSECURE_PREFIX!r}, the mark of a key Django made for development"
    if len(key) < SECRET_KEY_MIN_LENGTH or len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        return (
            f"it has {len(key)} characters, {len(set(key))} of them different, where at least "
            f"{SECRET_KEY_MIN_LENGTH} characters and {SECRET_KEY_MIN_UNIQUE_CHARACTERS} different ones are needed"
        )
    return None


def secret_key_refusal(source: str, weakness: str) -> str:
    return (
        f"{source} is too easy to guess: {weakness}. With it anyone can compute every calendar feed's URL and "
        f"forge sessions. Generate one ({GENERATE_SECRET}) and set SECRET_KEY (or SECRET_KEY_FILE) to it, or "
        "leave both unset to have one generated under VAR_DIR."
    )


def is_local_host(host: str) -> bool:
    """This machine only: localhost, a loopback address, a name under .localhost (RFC 6761)."""
    name = host.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _is_machine_name(host: str) -> bool:
    """A name without a dot (a container's, such as docker-compose's "web"): no public name, so no certificate
    for it either. Not '*' nor an address."""
    name = host.strip().lower()
    if not name or name == "*" or "." in name or ":" in name:
        return False
    return all(c.isalnum() or c in "-_" for c in name)


def this_machine_only(portal_url: str, allowed_hosts: Iterable[str]) -> bool:
    """The portal says it is reached on this machine: PORTAL_URL's host is local and every name it answers to is
    local or a machine name (the demo, scripts/run, docker-compose's example). There is no https to insist on."""
    host = urlsplit(portal_url).hostname or ""
    return is_local_host(host) and all(is_local_host(name) or _is_machine_name(name) for name in allowed_hosts)
