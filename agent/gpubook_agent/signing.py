"""Signing lease snapshots: HMAC-SHA256 over a canonical JSON form.

Shared by the portal (which signs) and the agent (which verifies), so both sides agree on the
exact bytes. Pure standard library: the agent imports nothing from Django.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping

SIGNATURE_FIELD = "signature"
# What ``sign`` writes: a SHA-256 hexdigest. Anything else is refused before it is compared: compare_digest
# raises TypeError on a str with non-ASCII characters, and that must be a refusal like any other.
SIGNATURE_RE = re.compile(r"\A[0-9a-f]{64}\Z")


def canonical_bytes(snapshot: Mapping[str, object]) -> bytes:
    """The snapshot without its signature, as compact JSON with sorted keys."""
    unsigned = {key: value for key, value in snapshot.items() if key != SIGNATURE_FIELD}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(snapshot: Mapping[str, object], secret: str) -> str:
    return hmac.new(secret.encode(), canonical_bytes(snapshot), hashlib.sha256).hexdigest()


def signed(snapshot: Mapping[str, object], secret: str) -> dict[str, object]:
    return {**snapshot, SIGNATURE_FIELD: sign(snapshot, secret)}


def verify(snapshot: Mapping[str, object], secret: str) -> bool:
    """True only if the snapshot carries a signature that matches its content and this secret."""
    given = snapshot.get(SIGNATURE_FIELD)
    if not isinstance(given, str) or not SIGNATURE_RE.match(given) or not secret:
        return False
    return hmac.compare_digest(given, sign(snapshot, secret))
