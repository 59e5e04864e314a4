"""Whether this node gives an account a GPU at all: the node's own word on the person-to-account
binding (docs/security.md).

The portal checks a username's syntax and refuses a deny list of service accounts, but only the
node knows its accounts. A lease is refused (that lease only; the rest of the snapshot is enforced
as usual) when its account does not exist here, is a system account (a uid below ``UID_MIN``, or
``nobody``), or is one of the agent's protected users. Lookups go through NSS (``pwd``), so LDAP
or SSSD accounts count. The enforcer's boundary path reads only cached answers; the checker
thread looks every lease's account up again at most once a minute, so an account created later is
noticed within that minute and a slow directory never delays a slot's start or end.
"""

from __future__ import annotations

import pwd
import threading
import time
from collections.abc import Callable

NOBODY_UID = 65534
CACHE_SECONDS = 60.0


class AccountCheck:
    """``refusal(name)``: why this node will not give ``name`` a GPU, or None when it will."""

    def __init__(
        self,
        *,
        uid_min: int,
        protected: frozenset[str] = frozenset(),
        lookup: Callable[[str], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.uid_min = uid_min
        self.protected = protected
        self._lookup = lookup or _uid_of
        self._clock = clock
        self._cache: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def refusal(self, name: str, *, max_age: float = CACHE_SECONDS) -> str | None:
        """Looked up again when the cached answer is older than ``max_age`` seconds."""
        now = self._clock()
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and now - cached[0] < max_age:
            return cached[1]
        answer = self._decide(name)
        with self._lock:
            if len(self._cache) > 10_000:  # names come from signed snapshots, but stay bounded anyway
                self._cache.clear()
            self._cache[name] = (now, answer)
        return answer

    def _decide(self, name: str) -> str | None:
        if name in self.protected:
            return f"{name!r} is a protected service account on this node (PROTECTED_USERS)"
        try:
            uid = self._lookup(name)
        except KeyError:
            return f"there is no account {name!r} on this node"
        if uid < self.uid_min:
            return f"{name!r} is a system account on this node (uid {uid} is below UID_MIN {self.uid_min})"
        if uid == NOBODY_UID:
            return f"{name!r} is the unprivileged 'nobody' account (uid {uid})"
        return None


def _uid_of(name: str) -> int:
    return pwd.getpwnam(name).pw_uid
