"""The node agent's own HTTP client to a portal, made from what a node's agent.conf holds (the backup and upgrade
tests pull a snapshot with it, as an agent does)."""

from __future__ import annotations

from gpubook_agent.config import config_from_values
from gpubook_agent.reporter import PortalClient


def agent_client(portal_url: str, node_name: str, secret: str, token: str) -> PortalClient:
    config = config_from_values(
        {
            "NODE_NAME": node_name,
            "BROKER_URL": "redis://127.0.0.1:1/0",  # not used: the pull goes over HTTP(S)
            "PORTAL_URL": portal_url,
            "LEASE_SECRET": secret,
            "AGENT_TOKEN": token,
            "ALLOW_INSECURE_PORTAL": "true",
        }
    )
    return PortalClient(config, timeout=30)
