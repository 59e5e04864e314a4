"""The agent's config: a KEY=value file, ``GPUBOOK_<KEY>`` variables on top, every value checked.

Every test passes an explicit ``environ`` so the real environment (and /etc/gpubook) never leaks in.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpubook_agent.config import AgentConfig, ConfigError, config_from_values, load_config
from gpubook_agent.gpus import open_configured_backend

REQUIRED = {
    "NODE_NAME": "gpu-a100",
    "BROKER_URL": "redis://broker:6379/0",
    "PORTAL_URL": "https://portal.example.org",
    "AGENT_TOKEN": "gpn_token",
    "LEASE_SECRET": "s3cret",
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.conf"
    path.write_text(text)
    return path


def config_file(tmp_path: Path, **extra: str) -> Path:
    values = {**REQUIRED, **extra}
    return write(tmp_path, "".join(f"{key}={value}\n" for key, value in values.items()))


def test_it_reads_the_lines_register_node_prints(tmp_path):
    config = load_config(config_file(tmp_path), environ={})

    assert config == AgentConfig(
        node_name="gpu-a100",
        broker_url="redis://broker:6379/0",
        portal_url="https://portal.example.org",
        agent_token="gpn_token",
        lease_secret="s3cret",
    )
    assert config.device_dir == "/dev"
    assert config.backend == "nvml"
    assert config.protected_users == frozenset()


def test_it_skips_comments_and_blank_lines_and_strips_quotes_and_spaces(tmp_path):
    path = write(
        tmp_path,
        "# written by register_node\n"
        "\n"
        "   \n"
        "  # an indented comment\n"
        'NODE_NAME="gpu-a100"\n'
        "BROKER_URL = 'redis://broker:6379/0'\n"
        "portal_url=https://portal.example.org/\n"
        "AGENT_TOKEN=\"gpn_token'\n"  # mismatched quotes stay
        'LEASE_SECRET="a=b#c"\n',
    )

    config = load_config(path, environ={})

    assert config.node_name == "gpu-a100"
    assert config.broker_url == "redis://broker:6379/0"
    assert config.portal_url == "https://portal.example.org"  # lower-case key accepted, trailing slash dropped
    assert config.agent_token == "\"gpn_token'"
    assert config.lease_secret == "a=b#c"  # only the first = splits; # inside a value is kept


def test_a_line_without_an_equals_sign_is_refused_with_its_line_number(tmp_path):
    path = write(tmp_path, "# comment\n\nNODE_NAME=gpu-a100\nBROKER_URL redis://broker\n")

    with pytest.raises(ConfigError, match=r"agent\.conf, line 4: expected KEY=value"):
        load_config(path, environ={})


def test_a_line_without_a_key_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="line 1: expected KEY=value"):
        load_config(write(tmp_path, "=value\n"), environ={})


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.conf", environ={})


def test_the_file_may_be_named_by_gpubook_agent_config(tmp_path):
    path = config_file(tmp_path)

    assert load_config(environ={"GPUBOOK_AGENT_CONFIG": str(path)}).node_name == "gpu-a100"


def test_a_file_named_by_gpubook_agent_config_must_exist(tmp_path):
    environ = {"GPUBOOK_AGENT_CONFIG": str(tmp_path / "agnet.conf"), **{f"GPUBOOK_{k}": v for k, v in REQUIRED.items()}}

    with pytest.raises(ConfigError, match=r"cannot read the config file .*agnet\.conf"):
        load_config(environ=environ)


def test_environment_variables_beat_the_file(tmp_path):
    path = config_file(tmp_path, GRACE_SECONDS="30")
    environ = {
        "GPUBOOK_NODE_NAME": "gpu-h100",
        "GPUBOOK_GRACE_SECONDS": "2.5",
        "GPUBOOK_BACKEND": "simulated",
        "GPUBOOK_NOT_A_SETTING": "ignored",  # other GPUBOOK_ variables are none of the agent's business
        "NODE_NAME": "not-prefixed",
    }

    config = load_config(path, environ=environ)

    assert config.node_name == "gpu-h100"
    assert config.grace_seconds == 2.5
    assert config.backend == "simulated"
    assert config.lease_secret == "s3cret"


def test_the_environment_alone_is_enough(tmp_path):
    environ = {"GPUBOOK_AGENT_CONFIG": str(write(tmp_path, "")), **{f"GPUBOOK_{k}": v for k, v in REQUIRED.items()}}

    assert load_config(environ=environ).agent_token == "gpn_token"


def test_missing_required_settings_are_named(tmp_path):
    path = write(tmp_path, "NODE_NAME=gpu-a100\nAGENT_TOKEN=\nPORTAL_URL=https://portal\n")

    with pytest.raises(ConfigError) as raised:
        load_config(path, environ={})

    assert "missing setting(s): BROKER_URL, AGENT_TOKEN, LEASE_SECRET" in str(raised.value)
    assert "NODE_NAME" not in str(raised.value).split("(")[0]


def test_unknown_settings_are_refused_by_name(tmp_path):
    path = config_file(tmp_path, GRACE_SECOND="5", EXTRA="1")

    with pytest.raises(ConfigError, match=r"unknown setting\(s\) EXTRA, GRACE_SECOND; known: "):
        load_config(path, environ={})


@pytest.mark.parametrize(
    "name", ["GPU-A100", "gpu_a100", "-gpu", "gpu-", "gpu.a100", "a" * 64, "gpu a100", "gpu\n", "../etc"]
)
def test_a_bad_node_name_is_refused(name):
    with pytest.raises(ConfigError, match="is not a valid node name"):
        config_from_values({**REQUIRED, "NODE_NAME": name})


@pytest.mark.parametrize("name", ["a", "gpu-a100", "node7", "a" * 63])
def test_good_node_names_are_accepted(name):
    assert config_from_values({**REQUIRED, "NODE_NAME": name}).node_name == name


@pytest.mark.parametrize("url", ["portal.example.org", "ftp://portal", "file:///etc/passwd", "javascript:x", " "])
def test_the_portal_url_must_be_http_or_https(url):
    with pytest.raises(ConfigError, match="PORTAL_URL must start with https://"):
        config_from_values({**REQUIRED, "PORTAL_URL": url})


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000/", "HTTP://portal.example.org", "http://127.0.0.1:8000"])
@pytest.mark.parametrize("flag", [None, "", "false", "0", "no"])
def test_plain_http_is_refused_without_allow_insecure_portal(url, flag):
    values = {**REQUIRED, "PORTAL_URL": url} | ({} if flag is None else {"ALLOW_INSECURE_PORTAL": flag})

    with pytest.raises(ConfigError) as refused:
        config_from_values(values)

    message = str(refused.value)
    assert message.startswith(f"PORTAL_URL {url!r} is plain http: the node token would travel in clear")
    assert "Use the portal's https:// address" in message
    assert "set ALLOW_INSECURE_PORTAL=true for a demo or a test network" in message


@pytest.mark.parametrize("flag", ["true", "1", "yes", "ON"])
def test_plain_http_is_accepted_with_allow_insecure_portal(flag):
    config = config_from_values({**REQUIRED, "PORTAL_URL": "http://10.0.0.1:8000/", "ALLOW_INSECURE_PORTAL": flag})

    assert config.portal_url == "http://10.0.0.1:8000"
    assert config.allow_insecure_portal is True


def test_https_needs_no_flag_and_the_flag_defaults_to_false():
    config = config_from_values(REQUIRED)

    assert config.portal_url == "https://portal.example.org"
    assert config.allow_insecure_portal is False


def test_allow_insecure_portal_may_come_from_the_environment(tmp_path):
    path = config_file(tmp_path, PORTAL_URL="http://portal.lab:8000")

    with pytest.raises(ConfigError, match="is plain http"):
        load_config(path, environ={})
    assert load_config(path, environ={"GPUBOOK_ALLOW_INSECURE_PORTAL": "true"}).allow_insecure_portal is True


def test_a_bad_allow_insecure_portal_is_refused():
    with pytest.raises(ConfigError, match="ALLOW_INSECURE_PORTAL must be true or false, not 'sometimes'"):
        config_from_values({**REQUIRED, "PORTAL_URL": "http://portal.lab", "ALLOW_INSECURE_PORTAL": "sometimes"})


def test_numbers_are_parsed():
    config = config_from_values(
        {
            **REQUIRED,
            "GRACE_SECONDS": "0.5",
            "RECONCILE_SECONDS": "2",
            "HEARTBEAT_SECONDS": "1e1",
            "TELEMETRY_SECONDS": "3",
            "SIMULATED_GPUS": "8",
        }
    )

    assert (config.grace_seconds, config.reconcile_seconds, config.heartbeat_seconds) == (0.5, 2.0, 10.0)
    assert config.telemetry_seconds == 3.0
    assert config.simulated_gpus == 8


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("soon", "must be a number"),
        ("", None),  # empty means the default
        ("0", "must be greater than 0"),
        ("-1", "must be greater than 0"),
        ("nan", "must be greater than 0"),
        ("inf", "must be at most"),
        ("1e400", "must be at most"),
        ("1e12", "must be at most"),  # would overflow timedelta / thread timeouts and kill a thread
    ],
)
@pytest.mark.parametrize("key", ["GRACE_SECONDS", "RECONCILE_SECONDS", "HEARTBEAT_SECONDS", "TELEMETRY_SECONDS"])
def test_bad_periods_are_refused(key, raw, message):
    if message is None:
        assert getattr(config_from_values({**REQUIRED, key: raw}), key.lower()) == getattr(AgentConfig, key.lower())
        return
    with pytest.raises(ConfigError, match=f"{key} {message}"):
        config_from_values({**REQUIRED, key: raw})


@pytest.mark.parametrize(
    ("raw", "message"),
    [("two", "a whole number"), ("1.5", "a whole number"), ("inf", "a whole number"), ("0", "at least 1")],
)
def test_bad_simulated_gpu_counts_are_refused(raw, message):
    with pytest.raises(ConfigError, match=f"SIMULATED_GPUS must be {message}"):
        config_from_values({**REQUIRED, "SIMULATED_GPUS": raw})


def test_the_simulated_cards_come_from_the_config_and_reach_the_backend(tmp_path):
    path = config_file(
        tmp_path,
        BACKEND="simulated",
        SIMULATED_GPUS="2",
        SIMULATED_MODEL="NVIDIA A100-SXM4-80GB",
        SIMULATED_MEMORY_MIB="81920",
        SIMULATED_POWER_W="400",
        DEVICE_DIR=str(tmp_path / "dev"),
    )
    config = load_config(path, environ={"GPUBOOK_SIMULATED_POWER_W": "412.5"})
    assert (config.simulated_model, config.simulated_memory_mib) == ("NVIDIA A100-SXM4-80GB", 81920)
    assert config.simulated_power_w == 412.5

    backend = open_configured_backend(config)
    assert [(gpu.name, gpu.memory_total_mib) for gpu in backend.gpus()] == [("NVIDIA A100-SXM4-80GB", 81920)] * 2
    assert backend.sample()[0].power_w == round(412.5 * 0.15, 1)


def test_without_them_a_simulated_card_is_the_default_one():
    config = config_from_values({**REQUIRED, "BACKEND": "simulated", "SIMULATED_MODEL": ""})
    assert (config.simulated_model, config.simulated_memory_mib, config.simulated_power_w) == (
        "Simulated GPU",
        24576,
        300.0,
    )


@pytest.mark.parametrize(
    ("key", "raw", "message"),
    [
        ("SIMULATED_MODEL", "A100\tSXM", "SIMULATED_MODEL must be printable text"),
        ("SIMULATED_MODEL", "x" * 101, "at most 100 characters"),
        ("SIMULATED_MEMORY_MIB", "80GB", "SIMULATED_MEMORY_MIB must be a whole number"),
        ("SIMULATED_MEMORY_MIB", "4", "SIMULATED_MEMORY_MIB must be between 5 and 4194304"),
        ("SIMULATED_MEMORY_MIB", "8388608", "SIMULATED_MEMORY_MIB must be between 5 and 4194304"),
        ("SIMULATED_POWER_W", "lots", "SIMULATED_POWER_W must be a number of watts"),
        ("SIMULATED_POWER_W", "0", "more than 0 and at most 5000"),
        ("SIMULATED_POWER_W", "nan", "more than 0 and at most 5000"),
        ("SIMULATED_POWER_W", "inf", "more than 0 and at most 5000"),
    ],
)
def test_bad_simulated_cards_are_refused_by_name(key, raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_values({**REQUIRED, "BACKEND": "simulated", key: raw})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False), ("false", False), ("No", False)],
)
def test_booleans_are_parsed(raw, expected):
    assert config_from_values({**REQUIRED, "END_VIOLATIONS": raw}).end_violations is expected


@pytest.mark.parametrize("raw", ["maybe", "2", "y", "enabled"])
def test_a_bad_boolean_is_refused(raw):
    with pytest.raises(ConfigError, match="END_VIOLATIONS must be true or false"):
        config_from_values({**REQUIRED, "END_VIOLATIONS": raw})


def test_power_caps_are_allowed_unless_the_node_refuses_them():
    assert config_from_values(REQUIRED).allow_power_cap is True
    assert config_from_values({**REQUIRED, "ALLOW_POWER_CAP": "false"}).allow_power_cap is False
    with pytest.raises(ConfigError, match="ALLOW_POWER_CAP must be true or false"):
        config_from_values({**REQUIRED, "ALLOW_POWER_CAP": "sometimes"})


def test_an_unknown_backend_is_refused():
    with pytest.raises(ConfigError, match="BACKEND must be nvml or simulated, not 'cuda'"):
        config_from_values({**REQUIRED, "BACKEND": "cuda"})


def test_log_level_is_checked_here_not_by_a_traceback_in_main():
    assert config_from_values({**REQUIRED, "LOG_LEVEL": "debug"}).log_level == "debug"  # main upper-cases it
    with pytest.raises(ConfigError, match="LOG_LEVEL must be one of DEBUG, INFO"):
        config_from_values({**REQUIRED, "LOG_LEVEL": "LOUD"})


def test_a_simulated_node_without_device_dir_uses_its_state_dir_never_dev():
    config = config_from_values({**REQUIRED, "BACKEND": "simulated", "STATE_DIR": "/srv/agent"})
    assert config.device_dir == "/srv/agent/dev"

    default_state = config_from_values({**REQUIRED, "BACKEND": "simulated", "DEVICE_DIR": ""})
    assert default_state.device_dir == "/var/lib/gpubook-agent/dev"


def test_a_simulated_node_keeps_an_explicit_device_dir():
    config = config_from_values({**REQUIRED, "BACKEND": "simulated", "DEVICE_DIR": "/srv/fake-devices"})
    assert config.device_dir == "/srv/fake-devices"


def test_an_nvml_node_guards_the_real_dev():
    assert config_from_values({**REQUIRED, "STATE_DIR": "/srv/agent"}).device_dir == "/dev"


def test_mig_capability_files_are_the_drivers_on_an_nvml_node():
    config = config_from_values(REQUIRED)
    assert (config.mig_minors_file, config.mig_caps_dir) == ("/proc/driver/nvidia-caps/mig-minors", "/dev/nvidia-caps")

    moved = config_from_values({**REQUIRED, "MIG_MINORS_FILE": "/run/mig-minors", "MIG_CAPS_DIR": "/dev/caps"})
    assert (moved.mig_minors_file, moved.mig_caps_dir) == ("/run/mig-minors", "/dev/caps")


def test_a_simulated_node_keeps_its_stand_in_capability_files_beside_its_device_files():
    config = config_from_values({**REQUIRED, "BACKEND": "simulated", "DEVICE_DIR": "/srv/fake"})
    assert (config.mig_minors_file, config.mig_caps_dir) == ("/srv/fake/mig-minors", "/srv/fake/nvidia-caps")


def test_a_simulated_mig_layout_reaches_the_backend(tmp_path):
    config = config_from_values(
        {
            **REQUIRED,
            "BACKEND": "simulated",
            "SIMULATED_GPUS": "2",
            "DEVICE_DIR": str(tmp_path / "dev"),
            "SIMULATED_MIG": "0:3g.40gb,2g.20gb,2g.20gb; 1:7g.80gb",
        }
    )
    backend = open_configured_backend(config)

    assert [[s.profile for s in card.slices] for card in backend.mig_cards()] == [
        ["2g.20gb", "2g.20gb", "3g.40gb"],
        ["7g.80gb"],
    ]
    assert (tmp_path / "dev" / "mig-minors").exists()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"SIMULATED_MIG": "0:9g.90gb"}, "SIMULATED_MIG: card 0: unknown MIG profile '9g.90gb'"),
        ({"SIMULATED_MIG": "0:4g.40gb,4g.40gb"}, "need 8 compute slices and a card has 7"),
        ({"SIMULATED_MIG": "0:3g.40gb,3g.40gb,1g.10gb"}, "do not fit on a card of 8 memory slices"),
        ({"SIMULATED_MIG": "4:7g.80gb"}, "card 4 does not exist: SIMULATED_GPUS is 4 (cards 0-3)"),
        ({"SIMULATED_MIG": "0:7g.80gb", "SIMULATED_GPUS": "1", "BACKEND": "nvml"}, "is for BACKEND=simulated"),
    ],
)
def test_an_impossible_simulated_mig_layout_is_refused_saying_why(values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_values({**REQUIRED, "BACKEND": "simulated", **values})


def test_protected_users_are_a_comma_separated_list():
    config = config_from_values({**REQUIRED, "PROTECTED_USERS": " dcgm-exporter, ,my-monitor,dcgm-exporter ,"})
    assert config.protected_users == frozenset({"dcgm-exporter", "my-monitor"})


def test_an_empty_protected_users_protects_nobody(tmp_path):
    config = load_config(config_file(tmp_path), environ={"GPUBOOK_PROTECTED_USERS": ""})
    assert config.protected_users == frozenset()


def test_the_queue_is_named_after_the_node():
    assert config_from_values(REQUIRED).queue == "node.gpu-a100"


def test_launch_settings_default_to_both_kinds_and_are_read_as_given():
    default = config_from_values(REQUIRED)
    assert default.launch_kinds == {"container", "command"}
    assert (default.podman_options, default.container_devices) == ((), ())

    given = config_from_values(
        {
            **REQUIRED,
            "LAUNCH_KINDS": " command ",
            "PODMAN_OPTIONS": "--runtime runc --cgroup-manager 'cgroupfs'",
            "CONTAINER_DEVICES": "/dev/nvidiactl, /dev/nvidia-uvm",
        }
    )
    assert given.launch_kinds == {"command"}
    assert given.podman_options == ("--runtime", "runc", "--cgroup-manager", "cgroupfs")
    assert given.container_devices == ("/dev/nvidiactl", "/dev/nvidia-uvm")
    assert config_from_values({**REQUIRED, "LAUNCH_KINDS": "none"}).launch_kinds == frozenset()
    assert config_from_values({**REQUIRED, "LAUNCH_KINDS": "both"}).launch_kinds == {"container", "command"}


@pytest.mark.parametrize(
    ("key", "raw", "words"),
    [
        ("LAUNCH_KINDS", "containers,vm", "LAUNCH_KINDS: containers, vm? Give container, command, both or none"),
        ("PODMAN_OPTIONS", "run --privileged", "PODMAN_OPTIONS are podman's global options"),
        ("PODMAN_OPTIONS", "--root 'unclosed", "PODMAN_OPTIONS: No closing quotation"),
        ("CONTAINER_DEVICES", "nvidiactl", "CONTAINER_DEVICES are absolute paths of device files, not 'nvidiactl'"),
        ("CONTAINER_DEVICES", "/dev/a:/dev/b", "CONTAINER_DEVICES are absolute paths"),
    ],
)
def test_bad_launch_settings_are_refused_with_words(key, raw, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        config_from_values({**REQUIRED, key: raw})


def test_the_launch_runner_is_auto_by_default_and_refuses_what_it_does_not_know():
    assert config_from_values(REQUIRED).launch_runner == "auto"
    assert config_from_values({**REQUIRED, "LAUNCH_RUNNER": "Systemd"}).launch_runner == "systemd"
    with pytest.raises(ConfigError, match="LAUNCH_RUNNER must be one of auto, systemd, supervisor, not 'docker'"):
        config_from_values({**REQUIRED, "LAUNCH_RUNNER": "docker"})
