"""Configuration and a small HTTP client for the portal's REST API, on urllib alone.

The portal answers every error as ``{"error": {"code", "message", "details"}}``; the client turns
those into :class:`ApiError`, and a portal it cannot reach into :class:`Unreachable`.
"""

from __future__ import annotations

import configparser
import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
API_PREFIX = "/api/v1/"
TIMEOUT_S = 30
BUSY_RETRIES = 3  # a 503 "booking busy" means nothing was written: asking again is safe
MAX_RETRY_WAIT_S = 5.0
MAX_PAGES = 1000


class ClientError(Exception):
    """Anything the CLI reports as one line on stderr."""


class ConfigError(ClientError):
    """The client is not configured well enough to ask anything."""


class Unreachable(ClientError):
    """No HTTP answer at all: refused, timed out, DNS, TLS."""


class ApiError(ClientError):
    """The portal answered with an error status."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.hints: list[str | None] = []  # lines the CLI adds below the message (None: nothing to add)


@dataclass(frozen=True)
class Config:
    url: str
    token: str | None
    source: str  # where the config file is (or would be), for messages


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    explicit = env.get("GPUBOOK_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    return Path.home() / ".config" / "gpubook" / "config.ini"


def _read_file(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc}") from None
    return dict(parser["gpubook"]) if parser.has_section("gpubook") else {}


def load_config(environ: Mapping[str, str] | None = None) -> Config:
    """URL and token: the environment wins over the config file, which wins over the defaults."""
    env = os.environ if environ is None else environ
    path = config_path(env)
    from_file = _read_file(path) if path.is_file() else {}
    url = env.get("GPUBOOK_URL") or from_file.get("url") or DEFAULT_URL
    token = env.get("GPUBOOK_TOKEN") or from_file.get("token") or None
    return Config(url=url.strip().rstrip("/"), token=token.strip() if token else None, source=str(path))


class Client:
    """Sends JSON to the API and returns the decoded JSON it answers."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.base = config.url
        parsed = urllib.parse.urlsplit(self.base)
        if parsed.scheme not in {"http", "https"} or not parsed.netloc:
            raise ConfigError(f"the portal URL {self.base!r} is not an http(s) URL: set GPUBOOK_URL.")

    def url_for(self, path: str, params: dict[str, Any] | None = None) -> str:
        url = self.base + API_PREFIX + path.lstrip("/")
        query = {key: _param(value) for key, value in (params or {}).items() if value is not None}
        return f"{url}?{urllib.parse.urlencode(query)}" if query else url

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.request("GET", self.url_for(path, params))

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", self.url_for(path), body or {})

    def get_all(self, path: str, params: dict[str, Any] | None = None) -> list[Any]:
        """Every item of a list, following ``next`` across pages (plain ``{"results"}`` too)."""
        url: str | None = self.url_for(path, params)
        items: list[Any] = []
        for _ in range(MAX_PAGES):
            if url is None:
                return items
            page = self.request("GET", url)
            if isinstance(page, list):
                return items + page
            items.extend(page.get("results", []))
            url = self._same_origin(page["next"]) if page.get("next") else None
        raise ClientError(f"gave up after {MAX_PAGES} pages of {path}")

    def _same_origin(self, url: str) -> str:
        """A ``next`` link, kept on the configured portal: the token is never sent anywhere else."""
        link, base = urllib.parse.urlsplit(url), urllib.parse.urlsplit(self.base)
        return urllib.parse.urlunsplit((base.scheme, base.netloc, link.path, link.query, ""))

    def request(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        for attempt in range(BUSY_RETRIES + 1):
            try:
                return self._send(method, url, body)
            except _Busy as busy:
                if attempt == BUSY_RETRIES:
                    raise busy.error from None
                time.sleep(busy.wait_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        headers = self._headers(body is not None)
        request = urllib.request.Request(url, method=method, headers=headers)  # noqa: S310 - scheme checked
        if body is not None:
            request.data = json.dumps(body).encode()
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - scheme checked
                return _decode(response.read(), url)
        except urllib.error.HTTPError as exc:
            raise _error_from(exc, url) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"cannot reach the portal at {self.base}: {reason}") from None

    def _headers(self, has_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "gpubook-cli"}
        if has_body:
            headers["Content-Type"] = "application/json"
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        return headers


class _Busy(Exception):
    def __init__(self, error: ApiError, wait_s: float) -> None:
        super().__init__(error.message)
        self.error = error
        self.wait_s = wait_s


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _decode(raw: bytes, url: str) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise ClientError(f"the answer from {url} is not JSON: is GPUBOOK_URL the portal?") from None


def _error_from(exc: urllib.error.HTTPError, url: str) -> Exception:
    try:
        payload = json.loads(exc.read() or b"null")
    except (ValueError, OSError):
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        api_error = ApiError(exc.code, str(error.get("code", "error")), str(error["message"]), error.get("details"))
    else:
        api_error = ApiError(exc.code, "http_error", f"HTTP {exc.code} {exc.reason} from {url}")
    if exc.code == 503 and exc.headers.get("Retry-After", "").isdigit():
        return _Busy(api_error, min(float(exc.headers["Retry-After"]), MAX_RETRY_WAIT_S))
    return api_error
