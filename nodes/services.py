"""Writes for nodes: registering a node and giving its agent fresh credentials."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from accounts.services import hash_token
from audit.services import audit_record
from nodes.models import Node

AGENT_TOKEN_PREFIX = "gpn_"  # noqa: S105 - a public marker, not a secret


@dataclass(frozen=True)
class AgentCredentials:
    node: Node
    lease_secret: str
    agent_token: str

    def as_config(self) -> str:
        """What the node's agent needs, as the lines of its config file."""
        return (
            f"NODE_NAME={self.node.name}\n"
            f"BROKER_URL={settings.CELERY_BROKER_URL}\n"
            f"PORTAL_URL={settings.PORTAL_URL}\n"
            f"LEASE_SECRET={self.lease_secret}\n"
            f"AGENT_TOKEN={self.agent_token}\n"
        )


def node_register(*, name: str, hostname: str, actor: Any | None = None, description: str = "") -> AgentCredentials:
    """Create a node and its agent's credentials (shown to the caller once)."""
    node = Node(name=name, hostname=hostname, description=description)
    node.full_clean()
    with transaction.atomic():
        node.save()
        credentials = _new_credentials(node)
        audit_record(actor=actor, action="node.register", target=node, after={"name": name, "hostname": hostname})
    return credentials


def node_rotate_credentials(*, node: Node, actor: Any | None = None) -> AgentCredentials:
    """New secret and token for an existing node; the old ones stop working at once."""
    with transaction.atomic():
        credentials = _new_credentials(node)
        audit_record(actor=actor, action="node.rotate_credentials", target=node)
    return credentials


def _new_credentials(node: Node) -> AgentCredentials:
    lease_secret = secrets.token_hex(32)
    agent_token = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    node.lease_secret, node.agent_token_hash = lease_secret, hash_token(agent_token)
    node.save(update_fields=["lease_secret", "agent_token_hash"])
    return AgentCredentials(node=node, lease_secret=lease_secret, agent_token=agent_token)
