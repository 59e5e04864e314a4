"""System checks of the shell's own settings: deployment mistakes that must not run (docs/security.md, "Refused
at start"). What no process may start with (a placeholder from deploy/portal.env.example, a SECRET_KEY that can
be guessed) is refused by settings.py itself, before any check runs; these need the settings as a whole.

The container's entrypoint runs ``manage.py check --deploy --fail-level WARNING`` before the web server starts
(deploy/docker-entrypoint), as scripts/run does before the Procfile's.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register

from kernel.deployment import is_local_host, reached_from_elsewhere


@register(Tags.security)
def check_debug_only_on_this_machine(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """DEBUG's error pages show the settings, the code around the fault and the request's data to whoever made
    the request: for a developer at this machine, never for a name others reach. At every start, not only with
    --deploy: nobody runs --deploy on what they believe is their laptop."""
    if not settings.DEBUG:
        return []
    public = [host for host in settings.ALLOWED_HOSTS if not is_local_host(host)]
    if not public:
        return []
    return [
        Error(
            f"DEBUG is on while the portal answers to {', '.join(public)}: its error pages would show anyone who "
            "reaches it the settings, the code and the data of the failing request.",
            hint="Set DEBUG=false for a portal others reach. DEBUG is for this machine only: ALLOWED_HOSTS "
            "localhost, 127.0.0.1, [::1] or names under .localhost.",
            id="portal.E001",
        )
    ]


@register(Tags.security, deploy=True)
def check_portal_url_is_https(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """PORTAL_URL is the address people and agents use: http there sends passwords, session cookies, API and
    node tokens and feed URLs across the network in clear. A deployment check (quiet under DEBUG, which
    portal.E001 keeps to this machine, and for a portal reached on this machine alone: the demo, scripts/run)."""
    url = urlsplit(settings.PORTAL_URL)
    if settings.DEBUG or url.scheme != "http":
        return []
    reasons = reached_from_elsewhere(
        portal_url=settings.PORTAL_URL,
        allowed_hosts=settings.ALLOWED_HOSTS,
        local_names=settings.LOCAL_HOST_NAMES,
        csrf_trusted_origins=settings.CSRF_TRUSTED_ORIGINS,
        trust_x_forwarded_proto=settings.TRUST_X_FORWARDED_PROTO,
        use_x_forwarded_host=settings.USE_X_FORWARDED_HOST,
        num_proxies=settings.NUM_PROXIES,
    )
    if not reasons:
        return []
    if is_local_host(url.hostname or ""):
        # Behind a proxy, say, with the example's PORTAL_URL left as it was: mails and agents are sent to this
        # machine's name, and Django's https warnings would have stayed quiet without this.
        message = (
            f"PORTAL_URL ({settings.PORTAL_URL}) is http on this machine's name while others reach the portal "
            f"({'; '.join(reasons)}): links in mails and the address given to agents point at this machine's own "
            "name, over http."
        )
    else:
        message = (
            f"PORTAL_URL ({settings.PORTAL_URL}) is http on a host others reach: passwords, session cookies, API "
            "and node tokens and calendar feed URLs would cross the network in clear."
        )
    return [
        Error(
            message,
            hint="Serve the portal over https behind a TLS-terminating proxy and set PORTAL_URL=https://... with "
            "TRUST_X_FORWARDED_PROTO=true (docs/security.md). A lab that accepts http on a network of its own "
            "says so with SILENCED_SYSTEM_CHECKS=portal.E002.",
            id="portal.E002",
        )
    ]
