"""The settings module as a deployment reads it: each test starts a fresh interpreter with its own
environment, because settings are read once, at import."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

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


def test_check_deploy_warns_in_a_development_environment(tmp_path):
    """The control for the test above: --deploy does see the gaps when nothing is configured."""
    done = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], tmp_path)
    assert done.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in done.stderr


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
