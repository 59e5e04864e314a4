"""The unix username syntax, for the portal (accounts.validators) and the node agent alike.

Plain Python, because the agent imports nothing from Django. A name reaches system calls on
the nodes (``setfacl``, process ownership), so it is checked before anything runs; ``\\Z``
rather than ``$`` so a trailing newline cannot slip through.

Which accounts may receive a GPU is decided elsewhere: the portal refuses a configurable deny
list of service accounts (UNIX_USERNAME_DENYLIST), and each node refuses accounts it does not
have or whose uid is below UID_MIN (gpubook_agent/accounts.py), which no fixed list of names could.
"""

from __future__ import annotations

import re
from typing import TypeGuard

UNIX_USERNAME_RE = re.compile(r"\A[a-z_][a-z0-9_-]{0,31}\Z")


def valid_username(name: object) -> TypeGuard[str]:
    """True for a string that follows the portal's username syntax."""
    return isinstance(name, str) and UNIX_USERNAME_RE.match(name) is not None
