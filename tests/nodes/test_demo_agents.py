"""The demo's agent configs: written once with working credentials, kept while they still match."""

from __future__ import annotations

import stat
from io import StringIO

from django.core.management import call_command

from accounts.services import hash_token
from nodes.agent.config import load_config
from nodes.services import node_rotate_credentials


def run(directory) -> str:
    out = StringIO()
    call_command("demo_agents", "--dir", str(directory), stdout=out)
    return out.getvalue()


def test_configs_are_written_with_working_credentials_and_kept_while_they_match(node, tmp_path):
    run(tmp_path)
    path = tmp_path / "gpu-a100.conf"
    config = load_config(path, environ={})
    node.refresh_from_db()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (config.backend, config.simulated_gpus, config.node_name) == ("simulated", 4, "gpu-a100")
    assert hash_token(config.agent_token) == node.agent_token_hash and config.lease_secret == node.lease_secret
    assert config.device_dir.startswith(str(tmp_path))  # stand-in device files, never /dev
    assert config.portal_url == "http://127.0.0.1:8000" and config.allow_insecure_portal  # the demo's http portal

    assert "(kept)" in run(tmp_path)
    assert load_config(path, environ={}) == config

    node_rotate_credentials(node=node)  # e.g. an admin issued new ones
    assert "(kept)" not in run(tmp_path)
    node.refresh_from_db()
    assert hash_token(load_config(path, environ={}).agent_token) == node.agent_token_hash


def test_a_kept_config_the_agent_would_refuse_is_written_again(node, tmp_path):
    """An older demo's config: http, without ALLOW_INSECURE_PORTAL (the agents refuse that now)."""
    run(tmp_path)
    path = tmp_path / "gpu-a100.conf"
    path.write_text(path.read_text().replace("ALLOW_INSECURE_PORTAL=true\n", ""))

    assert "(kept)" not in run(tmp_path)
    assert load_config(path, environ={}).allow_insecure_portal
