"""Deployment mistakes the portal refuses, as rules that the settings (at import) and the system checks
(portal/checks.py) share, so each is written once (docs/security.md, "Refused at start").

- A value copied from deploy/portal.env.example and never filled in: its secrets all begin with
  ``replace-with-``, which anybody who has read the example knows. Only where it stands as a secret (a
  variable's value, a URL's password): the phrase in a sentence, such as a commit message a CI service puts in
  the environment, stops nothing.
- A SECRET_KEY that can be guessed: Django's own rule (its deployment check security.W009), which
  here stops every process, because every calendar feed URL and session is signed with it.
- Which host names are this machine's: DEBUG is for those only, and a portal that names nothing else
  (and has no proxy in front) is a trial on one machine (the demo, a laptop), where https cannot be asked for.
"""

from __future__ import annotations

import ipaddress
import re
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


# A placeholder as a value: the whole of it (SECRET_KEY=replace-with-...), or a URL's credential or part
# (redis://:replace-with-...@redis, ?password=replace-with-...). Not the words in a sentence: CI services put the
# commit message in the environment (GitLab's CI_COMMIT_MESSAGE, Buildkite's BUILDKITE_MESSAGE), and ours name
# the placeholders.
_PLACEHOLDER_VALUE = re.compile(rf"(?:\A|[:=/@]){re.escape(PLACEHOLDER)}[A-Za-z0-9_.-]*(?=\Z|[@/:?#&;])")
# The variables a placeholder reaches the portal through: the secrets of deploy/portal.env.example (each ends so, as
# tests/test_settings.py checks), and the URLs, passwords, keys, tokens and secret files of everything else the
# portal reads (EMAIL_URL, LDAP_BIND_PASSWORD, OIDC_RP_CLIENT_SECRET, SECRET_KEY_FILE, ...).
_SECRET_ENDINGS = ("_URL", "_PASSWORD", "_SECRET", "_KEY", "_TOKEN", "_FILE")


def placeholder_names(environ: Mapping[str, str]) -> list[str]:
    """The variables whose value still is an example's placeholder, or carries one, in order. A URL counts too:
    DATABASE_URL carries POSTGRES_PASSWORD's placeholder once Compose has put it in."""
    return sorted(
        name
        for name, value in environ.items()
        if name.upper().endswith(_SECRET_ENDINGS) and _PLACEHOLDER_VALUE.search(value.strip())
    )


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


def is_machine_name(host: str) -> bool:
    """A name without a dot, such as a container's (docker-compose's "web"): no public name. Not '*' nor an
    address."""
    name = host.strip().lower()
    if not name or name == "*" or "." in name or ":" in name:
        return False
    return all(c.isalnum() or c in "-_" for c in name)


def _host_of(origin: str) -> str:
    return urlsplit(origin).hostname or origin


def reached_from_elsewhere(
    *,
    portal_url: str,
    allowed_hosts: Iterable[str],
    local_names: Iterable[str],
    csrf_trusted_origins: Iterable[str],
    trust_x_forwarded_proto: bool,
    use_x_forwarded_host: bool,
    num_proxies: int,
) -> list[str]:
    """Why others reach the portal, in words; empty when it says it is reached on this machine alone (the demo,
    scripts/run, docker-compose's example), where there is no https to insist on.

    A name without a dot is no sign of that by itself: nginx's default ``proxy_set_header Host $proxy_host`` sends
    the upstream's name (``web``) for a public site, and an intranet's short names (``gpus``) reach a network. So
    only the names LOCAL_HOST_NAMES lists (the containers' names on this machine) count as local besides
    localhost, and none does once a proxy is in front (its headers trusted, or NUM_PROXIES) or a CSRF origin names
    another host: both are there for a site others reach. PORTAL_URL's host must be localhost or a loopback."""
    local = {name.strip().lower() for name in local_names}
    reasons = []
    portal_host = urlsplit(portal_url).hostname or ""
    if not is_local_host(portal_host):
        reasons.append(f"PORTAL_URL names {portal_host or portal_url!r}")
    hosts = [name for name in allowed_hosts if not is_local_host(name) and name.strip().lower() not in local]
    if hosts:
        reasons.append(f"ALLOWED_HOSTS names {', '.join(hosts)}")
    origins = [
        origin
        for origin in csrf_trusted_origins
        if not is_local_host(_host_of(origin)) and _host_of(origin).lower() not in local
    ]
    if origins:
        reasons.append(f"CSRF_TRUSTED_ORIGINS names {', '.join(origins)}")
    proxy = [
        *(["TRUST_X_FORWARDED_PROTO=true"] if trust_x_forwarded_proto else []),
        *(["USE_X_FORWARDED_HOST=true"] if use_x_forwarded_host else []),
        *([f"NUM_PROXIES={num_proxies}"] if num_proxies > 0 else []),
    ]
    if proxy:
        reasons.append(f"a proxy is in front of it: {', '.join(proxy)}")
    return reasons
