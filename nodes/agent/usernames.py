"""The unix username rule, for the portal (accounts.validators) and the node agent alike.

Plain Python, because the agent imports nothing from Django. A name reaches system calls on
the nodes (``setfacl``, process ownership), so it is checked before anything runs; ``\\Z``
rather than ``$`` so a trailing newline cannot slip through.
"""

from __future__ import annotations

import re

UNIX_USERNAME_RE = re.compile(r"\A[a-z_][a-z0-9_-]{0,31}\Z")

# Accounts that must never receive a booked GPU: root and the usual system accounts.
RESERVED_UNIX_USERNAMES = frozenset(
    {
        "root",
        "daemon",
        "bin",
        "sys",
        "sync",
        "games",
        "man",
        "lp",
        "mail",
        "news",
        "uucp",
        "proxy",
        "backup",
        "list",
        "irc",
        "nobody",
        "messagebus",
        "sshd",
        "polkitd",
        "nvidia-persistenced",
    }
)


def valid_username(name: object) -> bool:
    """True for a string that follows the portal's rule and is not a system account."""
    return isinstance(name, str) and UNIX_USERNAME_RE.match(name) is not None and name not in RESERVED_UNIX_USERNAMES
