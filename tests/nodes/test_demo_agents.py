"""The demo's agent configs: written once with working credentials, kept while they still match; the
simulated cards are the portal's GPU rows, and their stand-in files live in 0755 folders outside the checkout."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from accounts.services import hash_token
from gpubook_agent.config import load_config
from nodes.management.commands.demo_agents import power_limit
from nodes.services import node_rotate_credentials
from tests.factories import carve_mig, node_with_gpus


@pytest.fixture
def device_root() -> Iterator[Path]:
    """A device root as the demo's: in a folder every user may traverse (pytest's tmp_path is private)."""
    parent = tempfile.mkdtemp(prefix="gpbt-demo-", dir="/tmp")
    os.chmod(parent, 0o755)  # noqa: S103 - the demo users must reach the files below
    try:
        yield Path(parent) / "gpubook-demo"
    finally:
        shutil.rmtree(parent)


def run(directory, device_root) -> str:
    out = StringIO()
    call_command("demo_agents", "--dir", str(directory), "--device-root", str(device_root), stdout=out)
    return out.getvalue()


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_configs_are_written_with_working_credentials_and_kept_while_they_match(node, tmp_path, device_root):
    run(tmp_path, device_root)
    path = tmp_path / "gpu-a100.conf"
    config = load_config(path, environ={})
    node.refresh_from_db()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (config.backend, config.simulated_gpus, config.node_name) == ("simulated", 4, "gpu-a100")
    assert hash_token(config.agent_token) == node.agent_token_hash and config.lease_secret == node.lease_secret
    assert config.portal_url == "http://127.0.0.1:8000" and config.allow_insecure_portal  # the demo's http portal

    assert "(kept)" in run(tmp_path, device_root)
    assert load_config(path, environ={}) == config

    node_rotate_credentials(node=node)  # e.g. an admin issued new ones
    assert "(kept)" not in run(tmp_path, device_root)
    node.refresh_from_db()
    assert hash_token(load_config(path, environ={}).agent_token) == node.agent_token_hash


def test_the_simulated_cards_are_the_nodes_gpu_rows(db, tmp_path, device_root):
    node_with_gpus(4, name="gpu-a100")  # NVIDIA A100-SXM4-80GB, 81920 MiB
    rtx = node_with_gpus(2, name="gpu-4090")
    rtx.gpus.update(model="NVIDIA GeForce RTX 4090", memory_mib=24564)
    run(tmp_path, device_root)

    a100 = load_config(tmp_path / "gpu-a100.conf", environ={})
    assert (a100.simulated_gpus, a100.simulated_model) == (4, "NVIDIA A100-SXM4-80GB")
    assert (a100.simulated_memory_mib, a100.simulated_power_w) == (81920, 400.0)
    geforce = load_config(tmp_path / "gpu-4090.conf", environ={})
    assert (geforce.simulated_gpus, geforce.simulated_model) == (2, "NVIDIA GeForce RTX 4090")
    assert (geforce.simulated_memory_mib, geforce.simulated_power_w) == (24564, 450.0)
    assert a100.launch_runner == geforce.launch_runner == "supervisor"  # never units of the demo machine's systemd


def test_stand_in_files_live_in_0755_folders_outside_and_state_stays_private(node, tmp_path, device_root):
    run(tmp_path, device_root)
    config = load_config(tmp_path / "gpu-a100.conf", environ={})

    assert config.device_dir == str(device_root / "gpu-a100" / "dev")
    for folder in (device_root, device_root / "gpu-a100", device_root / "gpu-a100" / "dev"):
        info = os.lstat(folder)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
        assert mode(folder) == 0o755, folder
    assert config.state_dir == str(tmp_path / "gpu-a100" / "state")
    private = tmp_path / "agents"
    run(private, device_root)
    assert mode(private) == 0o700


def test_an_older_demos_config_is_moved_to_the_new_device_folder_with_the_same_credentials(node, tmp_path, device_root):
    run(tmp_path, device_root)
    path = tmp_path / "gpu-a100.conf"
    before = load_config(path, environ={})
    old_place = tmp_path / "gpu-a100" / "dev"  # where the stand-ins lived: under the private checkout
    text = path.read_text()
    for line in ("SIMULATED_MODEL", "SIMULATED_MEMORY_MIB", "SIMULATED_POWER_W"):
        text = "".join(kept for kept in text.splitlines(keepends=True) if not kept.startswith(line))
    path.write_text(text.replace(f"DEVICE_DIR={before.device_dir}", f"DEVICE_DIR={old_place}"))
    assert load_config(path, environ={}).device_dir == str(old_place)

    assert "settings updated" in run(tmp_path, device_root)
    after = load_config(path, environ={})
    assert after == before  # new place and cards, same token and secret: the stored snapshots stay trusted
    node.refresh_from_db()
    assert after.lease_secret == node.lease_secret


def test_a_device_root_others_may_write_to_is_repaired(node, tmp_path, device_root):
    device_root.mkdir()
    os.chmod(device_root, 0o777)  # noqa: S103 - what the test repairs
    assert "repaired to 0755" in run(tmp_path, device_root)
    assert mode(device_root) == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_device_root_of_someone_else_is_refused(node, tmp_path, device_root):
    device_root.mkdir()
    os.chown(device_root, 54321, 54321)
    with pytest.raises(CommandError, match="belongs to uid 54321"):
        run(tmp_path, device_root)
    assert not (tmp_path / "gpu-a100.conf").exists()


def test_a_device_root_that_is_a_link_is_refused(node, tmp_path, device_root):
    device_root.symlink_to(tmp_path)
    with pytest.raises(CommandError, match="is not a folder"):
        run(tmp_path, device_root)


def test_a_device_root_others_cannot_reach_is_refused(node, tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(CommandError, match="closed to others"):
        run(tmp_path, closed / "gpubook-demo")


def test_a_model_name_cannot_add_lines_to_the_config(node, tmp_path, device_root):
    node.gpus.update(model="Evil\nDEVICE_DIR=/dev\rBACKEND=nvml\x1b")
    run(tmp_path, device_root)
    config = load_config(tmp_path / "gpu-a100.conf", environ={})
    assert config.simulated_model == "Evil DEVICE_DIR=/dev BACKEND=nvml"
    assert (config.backend, config.device_dir) == ("simulated", str(device_root / "gpu-a100" / "dev"))


def test_a_node_without_gpus_gets_no_config(db, tmp_path, device_root):
    node_with_gpus(0, name="gpu-empty")
    assert "it has no GPUs" in run(tmp_path, device_root)
    assert not (tmp_path / "gpu-empty.conf").exists()


@pytest.mark.parametrize(
    ("model", "watts"),
    [
        ("NVIDIA A100-SXM4-80GB", 400.0),
        ("NVIDIA A100 80GB PCIe", 300.0),
        ("NVIDIA H100 80GB HBM3", 700.0),
        ("NVIDIA H100 PCIe", 350.0),
        ("NVIDIA GeForce RTX 4090", 450.0),
        ("NVIDIA L40S", 350.0),
        ("NVIDIA L4", 72.0),
        ("Tesla T4", 70.0),
        ("Simulated GPU", 300.0),
    ],
)
def test_power_limits_by_model(model, watts):
    assert power_limit(model) == watts


def test_a_kept_config_the_agent_would_refuse_is_written_again(node, tmp_path, device_root):
    """An older demo's config: http, without ALLOW_INSECURE_PORTAL (the agents refuse that now)."""
    run(tmp_path, device_root)
    path = tmp_path / "gpu-a100.conf"
    path.write_text(path.read_text().replace("ALLOW_INSECURE_PORTAL=true\n", ""))

    assert "(kept)" not in run(tmp_path, device_root)
    assert load_config(path, environ={}).allow_insecure_portal


def test_a_mig_card_is_written_into_the_simulated_layout_in_placement_order(db, tmp_path, device_root):
    card = node_with_gpus(2, name="gpu-a100").gpus.get(index=1)
    carve_mig(card)  # 3g.40gb at 0, 2g.20gb at 4 and 6
    run(tmp_path, device_root)
    config = load_config(tmp_path / "gpu-a100.conf", environ={})
    assert config.simulated_mig == "1:3g.40gb,2g.20gb,2g.20gb"
