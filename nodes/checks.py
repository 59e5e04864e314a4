"""System checks for the nodes' broker and their credentials (nodes/node_broker.py, nodes/broker_users.py).

A per-node broker user that cannot be made would stop register_node, so what can be known from the
settings alone is an error at every start. What the broker itself says (ACLs at all, the portal's right
to manage them, a default user that needs no password) and the nodes still on the portal's own
credential need a server, so like the database checks those run only when asked: ``manage.py
migrate`` and ``manage.py check --database default``. Nodes sharing the portal's own Redis is a deployment
matter, which a lab on one Redis (the demo, a laptop) may accept: ``manage.py check --deploy`` says it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError

from nodes.broker_users import DISABLE_HINT, LEGACY_USER_PREFIX, broker_probe, settings_problem, user_prefix
from nodes.models import Node
from nodes.node_broker import portal_settings_sharing_the_node_broker, shown_url


@register()
def check_broker_user_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    problem = settings.NODE_BROKER_USERS and settings_problem()
    if not problem:
        return []
    return [Error(f"{problem}.", hint="docs/agent.md, 'The broker'.", id="nodes.E001")]


@register(Tags.database)
def check_broker_server(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    if not databases or not settings.NODE_BROKER_USERS or settings_problem():
        return []
    shown = shown_url()
    messages: list[CheckMessage] = []
    probe = broker_probe()
    if not probe.reachable:
        return [
            Warning(
                f"Could not ask the broker at {shown} about node broker users: {probe.error}",
                hint="register_node and the admin's 'Issue new agent credentials' fail until it answers; "
                "manage.py check --database default asks again.",
                id="nodes.W001",
            )
        ]
    if not probe.acl_supported:
        messages.append(
            Error(
                f"The broker at {shown} has no ACL users ({probe.error}), so nodes cannot get a broker user each.",
                hint=f"Use Redis 6.2 or later, {DISABLE_HINT}.",
                id="nodes.E002",
            )
        )
    elif probe.missing:
        messages.append(
            Error(
                f"The portal's Redis user {probe.user!r} at {shown} may not run {', '.join(probe.missing)}, so it "
                "cannot give nodes a broker user each.",
                hint=f"ACL SETUSER {probe.user} +acl +client|kill (docs/agent.md, 'The broker'), {DISABLE_HINT}.",
                id="nodes.E003",
            )
        )
    else:
        if probe.cannot_list:
            messages.append(
                Warning(
                    f"The portal's Redis user {probe.user!r} at {shown} may not run acl users: nodes get their broker "
                    "users and the sync repairs them, but the users of this portal's prefix that no node has any more "
                    "(a removal that failed) stay.",
                    hint=f"ACL SETUSER {probe.user} +acl|users (docs/agent.md, 'The broker').",
                    id="nodes.W006",
                )
            )
        if probe.default_user_open:
            messages.append(
                Warning(
                    f"Redis' default user at {shown} needs no password: anyone who reaches Redis, a node included, "
                    "connects as it with every right, whatever its own broker user may do.",
                    hint="Give it a password (requirepass, and put it in REDIS_URL: redis://:<password>@host:6379/0) "
                    "or switch it off (ACL SETUSER default off, with the portal on a user of its own); docs/agent.md.",
                    id="nodes.W002",
                )
            )
    for alias in databases:
        try:
            names = list(
                Node.objects.using(alias)
                .exclude(agent_token_hash="")
                .filter(broker_password_hash="")
                .values_list("name", flat=True)
            )
        except DatabaseError:  # not migrated yet (``migrate`` runs the checks first): nothing to say
            continue
        if names:
            messages.append(
                Warning(
                    f"{len(names)} node(s) still use the portal's own broker credential: {', '.join(names)}.",
                    hint="Issue them new agent credentials (admin: Nodes, 'Issue new agent credentials', or "
                    "manage.py register_node NAME --rotate) and put the new lines in their agent.conf.",
                    id="nodes.W003",
                )
            )
        legacy = _nodes_on_legacy_usernames(alias)
        if legacy:
            messages.append(
                Warning(
                    f"{len(legacy)} node(s) have a broker user named as before portals had prefixes "
                    f"({LEGACY_USER_PREFIX}<name>): {', '.join(legacy)}. Another portal on the same Redis with a node "
                    "of the same name would replace that user, and its agent could no longer log in.",
                    hint="Issue them new agent credentials (admin: Nodes, 'Issue new agent credentials', or "
                    f"manage.py register_node NAME --rotate): their users become {user_prefix()}<name> "
                    "(NODE_BROKER_USER_PREFIX); docs/operations.md, 'Upgrades'.",
                    id="nodes.W005",
                )
            )
    return messages


def _nodes_on_legacy_usernames(alias: str) -> list[str]:
    try:
        return [
            name
            for name, username in Node.objects.using(alias)
            .exclude(broker_password_hash="")
            .values_list("name", "broker_username")
            if username == f"{LEGACY_USER_PREFIX}{name}"
        ]
    except DatabaseError:  # not migrated yet
        return []


@register(Tags.security, deploy=True)
def check_node_broker_is_its_own(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Redis cannot cap one user's connections: a node's broker credential can open them until maxclients, and
    a Redis shared with the portal then refuses the portal too. A deployment check, quiet under DEBUG and where
    NODE_BROKER_SHARED says the lab accepts it (the demo keeps one Redis)."""
    if settings.DEBUG or settings.NODE_BROKER_SHARED:
        return []
    shared = portal_settings_sharing_the_node_broker()
    if not shared:
        return []
    return [
        Warning(
            f"The nodes' broker (NODE_BROKER_URL, {shown_url()}) is the Redis server of {', '.join(shared)}: one "
            "node's broker credential can open connections until that Redis' maxclients, and then the portal's "
            "own tasks, cache, websockets and telemetry queue are refused as well.",
            hint="Give the nodes a Redis of their own and set NODE_BROKER_URL to it (docker-compose.yml's "
            'node-broker; docs/agent.md, "A broker of the nodes\' own"), or set NODE_BROKER_SHARED=true where '
            "the lab accepts that.",
            id="nodes.W004",
        )
    ]
