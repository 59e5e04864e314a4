"""Writes for nodes: registering a node, giving its agent fresh credentials, draining a GPU and returning
it to service."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.services import hash_token
from audit.services import audit_record
from nodes.broker_users import (
    agent_broker_url,
    broker_user_delete,
    broker_user_set,
    broker_username,
    lock_broker_user,
    new_password,
    password_hash,
)
from nodes.models import Gpu, Node
from nodes.signals import gpu_drained, gpu_returned

AGENT_TOKEN_PREFIX = "gpn_"  # noqa: S105 - a public marker, not a secret


@dataclass(frozen=True)
class AgentCredentials:
    node: Node
    lease_secret: str
    agent_token: str
    # With the node's own broker user and password (NODE_BROKER_USERS), else AGENT_BROKER_URL as it is.
    broker_url: str

    def as_config(self) -> str:
        """What the node's agent needs, as the lines of its config file."""
        return (
            f"NODE_NAME={self.node.name}\n"
            f"BROKER_URL={self.broker_url}\n"
            f"PORTAL_URL={settings.PORTAL_URL}\n"
            f"LEASE_SECRET={self.lease_secret}\n"
            f"AGENT_TOKEN={self.agent_token}\n"
        )


def node_register(*, name: str, hostname: str, actor: Any | None = None, description: str = "") -> AgentCredentials:
    """Create a node and its agent's credentials (shown to the caller once). Raises BrokerUserError, and
    creates nothing, when the broker refuses to make the node's broker user."""
    node = Node(name=name, hostname=hostname, description=description)
    node.full_clean()
    with transaction.atomic():
        node.save()
        credentials = _new_credentials(node)
        audit_record(actor=actor, action="node.register", target=node, after={"name": name, "hostname": hostname})
    return credentials


def node_rotate_credentials(*, node: Node, actor: Any | None = None) -> AgentCredentials:
    """New secret, token and broker password for an existing node; the old ones stop working at once,
    connections to the broker already open with the old password included. Raises BrokerUserError, and
    changes nothing, when the broker refuses."""
    with transaction.atomic():
        # The row lock orders this against broker_users_sync, which could otherwise put back the old hash.
        Node.objects.select_for_update().get(pk=node.pk)
        credentials = _new_credentials(node)
        audit_record(actor=actor, action="node.rotate_credentials", target=node)
    return credentials


def _new_credentials(node: Node) -> AgentCredentials:
    """Inside the caller's transaction: the database first, then the broker user, so a broker that refuses
    rolls the new secret and token back too."""
    lease_secret = secrets.token_hex(32)
    agent_token = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    broker_password = new_password() if settings.NODE_BROKER_USERS else None
    # The node's user as stored now (a name from before prefixes, or none), which the new one replaces.
    old_username = (
        Node.objects.filter(pk=node.pk)
        .exclude(broker_password_hash="")
        .values_list("broker_username", flat=True)
        .first()
    ) or ""
    node.lease_secret, node.agent_token_hash = lease_secret, hash_token(agent_token)
    node.broker_password_hash = password_hash(broker_password) if broker_password else ""
    node.broker_username = broker_username(node.name) if broker_password else ""
    node.save(update_fields=["lease_secret", "agent_token_hash", "broker_password_hash", "broker_username"])
    if broker_password:
        lock_broker_user(node.broker_username)  # until this commits: the sync must not take it for a leftover
        broker_user_set(
            username=node.broker_username,
            node_name=node.name,
            password_sha256=node.broker_password_hash,
            end_sessions=True,
            replaces=old_username,
        )
    elif old_username:
        # Per-node users switched off since the last issue: the old user must not keep working (nor would
        # the sync remove it, as it now skips this node), so it goes, and its sessions with it.
        broker_user_delete(old_username)
    return AgentCredentials(
        node=node,
        lease_secret=lease_secret,
        agent_token=agent_token,
        broker_url=agent_broker_url(username=node.broker_username, password=broker_password),
    )


def gpu_drain(*, gpu: Gpu, reason: str, actor: Any | None = None) -> None:
    """Take a GPU out of booking until an admin returns it (already drained: kept as it was)."""
    reason = reason[:500]
    updated = Gpu.objects.filter(pk=gpu.pk, drained_at__isnull=True).update(
        drained_at=timezone.now(), drain_reason=reason
    )
    if updated:
        audit_record(actor=actor, action="gpu.drain", target=gpu, after={"reason": reason})
        gpu_drained.send(sender=Gpu, gpu=gpu, reason=reason, actor=actor)


def gpu_return_to_service(*, gpu: Gpu, actor: Any) -> bool:
    """Make a drained GPU bookable again; False if it was not drained (nothing changes)."""
    before = {"drained_at": gpu.drained_at.isoformat() if gpu.drained_at else None, "reason": gpu.drain_reason}
    updated = Gpu.objects.filter(pk=gpu.pk, drained_at__isnull=False).update(drained_at=None, drain_reason="")
    if updated:
        audit_record(actor=actor, action="gpu.undrain", target=gpu, before=before)
        gpu_returned.send(sender=Gpu, gpu=gpu, actor=actor)
    return bool(updated)
