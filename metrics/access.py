"""Who may scrape /metrics: the holder of METRICS_TOKEN (a bearer token, compared in constant time)
or an address in METRICS_ALLOWED_IPS (REMOTE_ADDR); either is enough. With neither set, nobody,
not even 127.0.0.1: behind a reverse proxy on the same host every request comes from there."""

from __future__ import annotations

import hmac
import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_network(entry: str) -> Network | None:
    """An address or CIDR of METRICS_ALLOWED_IPS as a network (host bits allowed); None if invalid."""
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return None


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    # Invalid entries are left out (and reported by the system check metrics.E001), never a 500.
    return tuple(network for network in map(parse_network, entries) if network is not None)


def _address(remote_addr: str | None) -> Address | None:
    try:
        address = ipaddress.ip_address((remote_addr or "").strip())
    except ValueError:  # empty (a unix socket) or not an address
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:10.0.0.7 from a dual-stack socket is 10.0.0.7
    return address


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def address_allowed(remote_addr: str | None, entries: list[str]) -> bool:
    address = _address(remote_addr)
    return address is not None and any(address in network for network in _networks(tuple(entries)))


def token_matches(presented: str | None, expected: str) -> bool:
    if not expected or presented is None:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def scrape_refusal(request: HttpRequest) -> str | None:
    """None if this request may read /metrics, else the sentence that says why not and what to do."""
    token, allowed = settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS
    if not token and not allowed:
        return (
            "/metrics is closed until it is configured: set METRICS_TOKEN (a bearer token for Prometheus) "
            "or METRICS_ALLOWED_IPS (the addresses or CIDRs it scrapes from), see docs/metrics.md."
        )
    presented = _bearer(request)
    remote_addr = request.META.get("REMOTE_ADDR")
    if token_matches(presented, token) or (allowed and address_allowed(remote_addr, allowed)):
        return None
    ways = []
    if token:
        ways.append(
            "send 'Authorization: Bearer <METRICS_TOKEN>'"
            if presented is None
            else "send the token set in METRICS_TOKEN (the one sent does not match)"
        )
    if allowed:
        ways.append(
            f"scrape from an address in METRICS_ALLOWED_IPS (this request came from {remote_addr or 'nowhere'})"
        )
    return f"Not allowed to read /metrics: {' or '.join(ways)}."
