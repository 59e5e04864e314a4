"""The settings module as a deployment reads it: each test starts a fresh interpreter with its own
environment, because settings are read once, at import."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.deployment import placeholder_names

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ENV = ROOT / "deploy" / "portal.env.example"

# Variables a test's environment must not inherit from the shell that runs pytest.
_OURS = {
    "DEBUG",
    "SECRET_KEY",
    "SECRET_KEY_FILE",
    "PORTAL_URL",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "TRUST_X_FORWARDED_PROTO",
    "USE_X_FORWARDED_HOST",
    "SECURE_SSL_REDIRECT",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SILENCED_SYSTEM_CHECKS",
    "STATIC_MANIFEST",
    "LOG_FORMAT",
    "DJANGO_SETTINGS_MODULE",
    "NODE_BROKER_URL",
    "NODE_BROKER_SHARED",
    "NUM_PROXIES",
    "LOCAL_HOST_NAMES",
}

# The production environment docs/security.md documents, behind a TLS-terminating proxy.
PRODUCTION = {
    "DEBUG": "0",
    "PORTAL_URL": "https://gpus.example.org",
    "ALLOWED_HOSTS": "gpus.example.org",
    "TRUST_X_FORWARDED_PROTO": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    # The nodes on a Redis of their own (docs/agent.md, "A broker of the nodes' own"), the portal on REDIS_URL's.
    "NODE_BROKER_URL": "redis://node-broker.example.org:6379/0",
}


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in _OURS and not k.startswith(("OIDC_", "LDAP_"))}
    clean.update(VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="portal.settings", **env)
    return subprocess.run(  # noqa: S603 - our own interpreter and arguments
        [sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120, check=False
    )


def read_settings(tmp_path: Path, names: list[str], **env: str) -> dict:
    code = (
        "import json, django; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n, None) for n in {names!r}}}, default=str))"
    )
    done = run(["-c", code], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_check_deploy_is_clean_in_the_documented_production_environment(tmp_path):
    done = run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        tmp_path,
        SECRET_KEY=secrets.token_urlsafe(50),
        **PRODUCTION,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "no issues" in done.stdout


def test_check_deploy_warns_when_a_public_name_is_served_without_https(tmp_path):
    """The control for the test above: --deploy does see the gaps once the portal answers to a public name."""
    done = run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        tmp_path,
        ALLOWED_HOSTS="gpus.example.org",
        NODE_BROKER_SHARED="true",
    )
    assert done.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in done.stderr


# --- deployment mistakes refused at start (issue 37; kernel/deployment.py, portal/checks.py) ---------------------

DEPLOY_CHECK = ["manage.py", "check", "--deploy", "--fail-level", "WARNING"]


def test_the_embedded_default_passes_the_deployment_checks_as_scripts_run_starts_it(tmp_path):
    """scripts/run: SQLite, a key generated under var/, http://127.0.0.1:8000, DEBUG off, one Redis on purpose. A
    portal on this machine only has no https to insist on, so Django's https warnings stay quiet there."""
    done = run(DEPLOY_CHECK, tmp_path, NODE_BROKER_SHARED="true")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "no issues" in done.stdout
    assert len((tmp_path / "secret-key").read_text().strip()) >= 50
    assert "manage.py check --deploy --fail-level WARNING" in (ROOT / "scripts" / "run").read_text()
    # docker-compose's example: its web answers to its container name too, and is published on 127.0.0.1.
    done = run(DEPLOY_CHECK, tmp_path, NODE_BROKER_SHARED="true", ALLOWED_HOSTS="localhost,127.0.0.1,web",
               PORTAL_URL="http://localhost:8000")  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.parametrize(
    "environment",
    [
        {"SECRET_KEY": "replace-with-a-generated-secret"},  # deploy/portal.env.example as copied
        {"REDIS_URL": "redis://:replace-with-a-generated-redis-password@redis:6379/0"},
        {"POSTGRES_PASSWORD": "replace-with-a-generated-password"},
        {"EMAIL_URL": "smtp://gpus:replace-with-the-mail-password@mail.example.org:587"},
    ],
)
def test_a_placeholder_anywhere_in_the_environment_stops_every_process(tmp_path, environment):
    done = run(["manage.py", "migrate", "--noinput"], tmp_path, **environment)
    assert done.returncode != 0
    (name,) = environment
    assert f"ImproperlyConfigured: {name} still holds a placeholder from deploy/portal.env.example" in done.stderr
    assert "print(secrets.token_urlsafe(50))" in done.stderr
    assert not (tmp_path / "portal.sqlite3").exists()  # nothing migrated


def test_a_celery_process_refuses_a_placeholder_too(tmp_path):
    """Not only the processes that run the system checks: any that loads the settings."""
    done = run(["-m", "celery", "-A", "portal", "report"], tmp_path, SECRET_KEY="replace-with-a-generated-secret")
    assert done.returncode != 0
    assert "SECRET_KEY still holds a placeholder" in done.stderr


def test_every_placeholder_is_named_at_once(tmp_path):
    done = run(
        ["manage.py", "check"],
        tmp_path,
        SECRET_KEY="replace-with-a-generated-secret",
        NODE_BROKER_URL="redis://:replace-with-a-generated-node-broker-password@node-broker:6379/0",
    )
    assert "NODE_BROKER_URL, SECRET_KEY still hold placeholders from deploy/portal.env.example" in done.stderr


def test_a_commit_message_naming_the_placeholders_stops_nothing(tmp_path):
    """Review of issue 37: CI services put the commit message in the environment (GitLab's CI_COMMIT_MESSAGE,
    Buildkite's BUILDKITE_MESSAGE), and ours name the placeholders. Only a placeholder standing as a value or a
    URL's password stops the portal, and only in a variable that can carry a secret."""
    message = (
        "Refuse a replace-with- placeholder at start (issue 37)\n\nThe example's "
        "SECRET_KEY=replace-with-a-generated-secret and\n"
        "REDIS_URL=redis://:replace-with-a-generated-redis-password@redis:6379/0 stop every process."
    )
    done = run(
        ["manage.py", "check"],
        tmp_path,
        CI_COMMIT_MESSAGE=message,
        BUILDKITE_MESSAGE=message,
        CHANGELOG_URL="https://example.org/changes/ (the replace-with- placeholders are refused)",
    )
    assert done.returncode == 0, done.stderr


def test_every_placeholder_of_the_example_is_found_as_copied_and_inside_its_urls():
    """Whatever deploy/portal.env.example gains: each placeholder it holds, and each URL Compose makes of one."""
    example = dict(
        line.split("=", 1) for line in EXAMPLE_ENV.read_text().splitlines() if line and not line.startswith("#")
    )
    copied = {name: value for name, value in example.items() if "replace-with-" in value}
    assert len(copied) >= 4
    assert placeholder_names(copied) == sorted(copied)
    urls = {
        name: re.sub(r"\$\{(\w+)\}", lambda variable: example[variable[1]], value)
        for name, value in example.items()
        if "${" in value
    }
    assert {"DATABASE_URL", "REDIS_URL", "NODE_BROKER_URL"} <= set(urls)
    assert placeholder_names(urls) == sorted(urls)
    # A secret's file (SECRET_KEY_FILE) and a password in a query string are found too.
    assert placeholder_names({"SECRET_KEY_FILE": "replace-with-a-generated-secret\n"}) == ["SECRET_KEY_FILE"]
    assert placeholder_names({"EMAIL_URL": "smtp://mail.example.org:587/?password=replace-with-it&tls=True"}) == [
        "EMAIL_URL"
    ]


def test_a_secret_file_holding_a_placeholder_stops_the_portal(tmp_path):
    secret = tmp_path / "secret_key"
    secret.write_text("replace-with-a-generated-secret\n")
    done = run(["manage.py", "check"], tmp_path, SECRET_KEY_FILE=str(secret))
    assert done.returncode != 0
    assert f"SECRET_KEY_FILE ({secret}) still holds a placeholder" in done.stderr


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("s3cr3t-but-short", "it has 16 characters, 10 of them different, where at least 50 characters"),
        ("ab" * 40, "it has 80 characters, 2 of them different"),
        ("django-insecure-" + secrets.token_urlsafe(50), "it begins with 'django-insecure-'"),
    ],
)
def test_a_secret_key_that_can_be_guessed_stops_every_process(tmp_path, key, words):
    """Django's own rule (security.W009), which Django only warns about under --deploy."""
    done = run(["manage.py", "migrate", "--noinput"], tmp_path, SECRET_KEY=key)
    assert done.returncode != 0
    assert f"ImproperlyConfigured: SECRET_KEY is too easy to guess: {words}" in done.stderr
    assert "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'" in done.stderr
    assert key not in done.stderr
    weak_file = tmp_path / "secret-key"
    weak_file.write_text("0123456789")  # a key put under var/ by hand is held to the same rule
    done = run(["manage.py", "check"], tmp_path)
    assert f"ImproperlyConfigured: {weak_file} is too easy to guess" in done.stderr


@pytest.mark.parametrize("hosts", ["gpus.example.org", "*", "localhost,192.0.2.7", "web"])
def test_debug_on_a_public_name_is_an_error_at_every_start(tmp_path, hosts):
    done = run(["manage.py", "check"], tmp_path, DEBUG="true", ALLOWED_HOSTS=hosts)
    assert done.returncode != 0
    assert "(portal.E001) DEBUG is on while the portal answers to" in done.stderr
    assert "Set DEBUG=false for a portal others reach" in done.stderr


@pytest.mark.parametrize("hosts", ["", "localhost,127.0.0.1,[::1]", ".localhost,gpus.localhost", "127.0.0.2"])
def test_debug_on_this_machine_is_fine(tmp_path, hosts):
    done = run(["manage.py", "check"], tmp_path, DEBUG="true", ALLOWED_HOSTS=hosts)
    assert done.returncode == 0, done.stderr


def test_an_http_portal_url_for_the_world_is_refused_by_the_deployment_checks(tmp_path):
    production = {**PRODUCTION, "SECRET_KEY": secrets.token_urlsafe(50), "PORTAL_URL": "http://gpus.example.org"}
    done = run(DEPLOY_CHECK, tmp_path, **production)
    assert done.returncode != 0
    assert "(portal.E002) PORTAL_URL (http://gpus.example.org) is http on a host others reach" in done.stderr
    assert "set PORTAL_URL=https://" in done.stderr
    # Production only: plain `check` (CI, migrate) says nothing, and a lab on http says so on purpose.
    assert run(["manage.py", "check"], tmp_path, **production).returncode == 0
    done = run(["manage.py", "check", "--deploy"], tmp_path, **production, SILENCED_SYSTEM_CHECKS="portal.E002")
    assert "portal.E002" not in done.stderr


@pytest.mark.parametrize(
    "environment",
    [
        # nginx's default `proxy_set_header Host $proxy_host` sends the upstream's name, e.g. web, for a public site.
        {"ALLOWED_HOSTS": "web", "TRUST_X_FORWARDED_PROTO": "true"},
        {"ALLOWED_HOSTS": "localhost,127.0.0.1,web", "NUM_PROXIES": "1"},
        {"ALLOWED_HOSTS": "localhost,web", "USE_X_FORWARDED_HOST": "true"},
        {"ALLOWED_HOSTS": "web", "CSRF_TRUSTED_ORIGINS": "https://gpus.example.org"},
        {"ALLOWED_HOSTS": "localhost,gpus"},  # an intranet's short name
    ],
)
def test_a_portal_others_reach_is_asked_for_https_whatever_its_names(tmp_path, environment):
    """Review of issue 37: any name without a dot counted as this machine's, so a portal behind a TLS proxy with
    ALLOWED_HOSTS=web and the example's PORTAL_URL had Django's https warnings silenced and portal.E002 quiet. Only
    LOCAL_HOST_NAMES (web by default) are local besides localhost, and none is behind a proxy or a public origin."""
    done = run(DEPLOY_CHECK, tmp_path, NODE_BROKER_SHARED="true", PORTAL_URL="http://localhost:8000", **environment)
    assert done.returncode != 0
    assert (
        "(portal.E002) PORTAL_URL (http://localhost:8000) is http on this machine's name while others reach the portal"
        in done.stderr
    )
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in done.stderr


def test_local_host_names_lists_this_machines_container_names_only(tmp_path):
    done = run(DEPLOY_CHECK, tmp_path, NODE_BROKER_SHARED="true", ALLOWED_HOSTS="localhost,gpubox",
               LOCAL_HOST_NAMES="gpubox")  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = run(["manage.py", "check"], tmp_path, LOCAL_HOST_NAMES="web,gpus.example.org")
    assert done.returncode != 0
    assert "LOCAL_HOST_NAMES=web,gpus.example.org: list only names without a dot" in done.stderr


def test_check_deploy_warns_when_the_nodes_share_the_portals_redis(tmp_path):
    """Issue 36: one node's broker credential can fill the connections of the Redis it logs in to."""
    production = {**PRODUCTION, "SECRET_KEY": secrets.token_urlsafe(50)}
    del production["NODE_BROKER_URL"]
    done = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], tmp_path, **production)
    assert done.returncode != 0
    assert "nodes.W004" in done.stderr and "REDIS_URL, CELERY_BROKER_URL" in done.stderr
    # A lab that keeps one Redis on purpose (the demo's scripts/run) says so.
    done = run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"], tmp_path, NODE_BROKER_SHARED="true", **production
    )
    assert done.returncode == 0, done.stderr + done.stdout
    # Plain `check`, as CI and every start run it, never asks.
    assert "nodes.W004" not in run(["manage.py", "check"], tmp_path).stderr


def test_a_plain_development_environment_still_starts(tmp_path):
    done = run(["manage.py", "check"], tmp_path)
    assert done.returncode == 0, done.stderr
    values = read_settings(
        tmp_path,
        ["DEBUG", "SESSION_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_PROXY_SSL_HEADER", "STORAGES"],
    )
    assert values["DEBUG"] is False
    assert values["SESSION_COOKIE_SECURE"] is False
    assert values["SECURE_SSL_REDIRECT"] is False
    assert values["SECURE_PROXY_SSL_HEADER"] is None
    assert values["STORAGES"]["staticfiles"]["BACKEND"] == "whitenoise.storage.CompressedStaticFilesStorage"


def test_an_https_portal_url_secures_cookies_and_trusts_its_own_origin(tmp_path):
    values = read_settings(
        tmp_path,
        ["SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "CSRF_TRUSTED_ORIGINS", "SECURE_SSL_REDIRECT"],
        PORTAL_URL="https://gpus.example.org",
        CSRF_TRUSTED_ORIGINS="https://other.example.org",
    )
    assert values["SESSION_COOKIE_SECURE"] is True
    assert values["CSRF_COOKIE_SECURE"] is True
    assert values["CSRF_TRUSTED_ORIGINS"] == ["https://other.example.org", "https://gpus.example.org"]
    # Without a trusted proxy header every request looks like http: redirecting would loop.
    assert values["SECURE_SSL_REDIRECT"] is False


def test_proxy_headers_are_trusted_only_when_asked(tmp_path):
    names = ["SECURE_PROXY_SSL_HEADER", "USE_X_FORWARDED_HOST", "SECURE_SSL_REDIRECT"]
    values = read_settings(tmp_path, names, **PRODUCTION, USE_X_FORWARDED_HOST="yes")
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert values["USE_X_FORWARDED_HOST"] is True
    assert values["SECURE_SSL_REDIRECT"] is True


def test_hsts_takes_subdomains_by_default_and_preload_only_when_asked(tmp_path):
    names = ["SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "SILENCED_SYSTEM_CHECKS"]
    values = read_settings(tmp_path, names, SECURE_HSTS_SECONDS="3600")
    assert values["SECURE_HSTS_SECONDS"] == 3600
    assert values["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert values["SECURE_HSTS_PRELOAD"] is False
    preloaded = read_settings(tmp_path, names, SECURE_HSTS_SECONDS="3600", SECURE_HSTS_PRELOAD="1")
    assert preloaded["SECURE_HSTS_PRELOAD"] is True
    assert "security.W021" not in preloaded["SILENCED_SYSTEM_CHECKS"]


@pytest.mark.parametrize("value", ["1", "true"])
def test_static_manifest_switches_to_hashed_file_names(tmp_path, value):
    values = read_settings(tmp_path, ["STORAGES"], STATIC_MANIFEST=value)
    assert values["STORAGES"]["staticfiles"]["BACKEND"] == "whitenoise.storage.CompressedManifestStaticFilesStorage"


def test_a_production_response_carries_the_security_headers(client, settings):
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_SSL_REDIRECT = True
    assert client.get("/accounts/login/").status_code == 301
    response = client.get("/accounts/login/", headers={"x-forwarded-proto": "https"})
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
