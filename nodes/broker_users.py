"""A broker credential per node: a Redis ACL user that can take its own queue and nothing else.

With the portal's own broker URL in every agent's config, anyone holding one node's config could read,
pop or delete another node's snapshots, put tasks on the portal's queue, publish into the websocket
layer and FLUSHALL. So each node gets its own Redis user, ``<prefix><name>``, allowed exactly what the
agent's Celery consumer sends (found by watching it with MONITOR and ACL LOG; docs/agent.md, "The
broker")::

    ACL SETUSER <prefix><name> reset on #<sha256 of the password> ~node.<name> resetchannels -@all +ping +brpop

plus ``+select`` when the queues live in a database other than 0. ``~node.<name>`` is one exact key:
the agent keeps ``priority_steps=[0]`` (no priority sub-keys) and no ack emulation (no shared
``unacked*`` keys), and declares nothing (no ``_kombu.binding.*``). No ``+lpush``: the consumer never
hands a message back (solo pool, early acks), and a node that could push would be able to fill Redis.

The password is shown once, inside the BROKER_URL register_node prints. The node's row keeps its
SHA-256, which Redis takes in place of the password (``#<hex>``), so ``broker_users_sync`` re-creates
every user after Redis restarted without an ACL file: beat runs it every minute, scripts/run and
docker-compose at start. The passwords are 32 random bytes, so an unsalted hash gives nothing away.
Rotation sets the new password and then ends the connections already logged in with the old one,
which a password change alone would leave open.

Redis ACL users belong to a whole server, not to one database, so two portals on one Redis (production and
staging, a test run beside the demo) would replace each other's users were the names only the nodes'. Each
portal's users start with a prefix of its own (``NODE_BROKER_USER_PREFIX``, by default a keyed hash of its
address and database: ``default_user_prefix``), and the sync removes no user outside it. The prefix ends with the
one '.' of the name, which no node name holds, so one portal's names can never be another's. Each node keeps
its user's name in its row, so users made before prefixes (``node-<name>``, migration nodes/0018) keep
working until the node's credentials are issued again, and a changed prefix renames nothing that exists.

The users live on the nodes' broker (NODE_BROKER_URL, nodes/node_broker.py: a Redis of the nodes' own, or by
default the portal's), and the portal manages them through its own connection to it, whose Redis user must
be allowed ``ACL`` and ``CLIENT KILL``. ``ACL USERS`` serves only the sync's removal of leftovers: a user that
may not run it still gets every node's user made and repaired, and the leftovers stay (nodes.W006). A nodes'
broker a node has filled up (maxclients) refuses that connection too: registering or rotating a node then
fails and changes nothing, and beat's sync waits.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from kombu.utils.url import maybe_sanitize_url

from gpubook_agent.protocol import queue_name
from kernel.locks import advisory_xact_lock
from nodes.models import Node, validate_node_name

log = logging.getLogger(__name__)

# The name of every node's user before portals had prefixes of their own (migration nodes/0018).
LEGACY_USER_PREFIX = "node-"
# A prefix: letters, digits, '-' and '_', then the name's one '.' (node names hold none).
USER_PREFIX_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,39}\.\Z")
REDIS_SCHEMES = ("redis", "rediss")
TIMEOUT_SECONDS = 5
# What the agent's consumer sends, and nothing more (docs/agent.md lists each command and why).
AGENT_COMMANDS = ("-@all", "+ping", "+brpop")
# What the portal's Redis user on the nodes' broker must be allowed for this module to work.
MANAGER_COMMANDS = (
    ("ACL", "SETUSER"),
    ("ACL", "GETUSER"),
    ("ACL", "DELUSER"),
    ("CLIENT", "KILL"),
)
# What it should be allowed as well: the sync lists the users to find its prefix's leftovers. Without it every
# node's user is still made and repaired; only the leftovers stay (nodes.W006).
LISTING_COMMAND = ("ACL", "USERS")
# What the key of the default prefix's HMAC (SECRET_KEY) is used for here, so that the same key used elsewhere
# never gives the same output.
PREFIX_PURPOSE = b"gpubook node broker user prefix"
DISABLE_HINT = (
    "or set NODE_BROKER_USERS=false to give every node the portal's own credential for the nodes' broker "
    "(one node's config then opens every queue)"
)


class BrokerUserError(Exception):
    """The broker could not make or change a node's user; the message says why and what to do."""


def default_user_prefix() -> str:
    """``gpubook-<8 hex>.``: an HMAC under SECRET_KEY of PORTAL_URL and the database the portal keeps its nodes in.

    All three come from the configuration, so every process of one portal (web, worker, beat, a manage.py command)
    and every restart finds the same prefix. Production and staging differ in the address and the database, even
    a staging restored from production's dump, which shares its rows and its SECRET_KEY; two installations left at
    the same defaults (two docker-compose stacks on http://localhost:8000 and postgres:5432/portal sharing one
    Redis) differ in the SECRET_KEY each generated for itself, where a hash of the address and the database alone
    would give both one prefix, and each one's sync would remove the other's users every minute.

    The prefix is no secret (it is in every agent.conf and in ``ACL USERS``), and 32 bits of an HMAC say nothing
    of its key. Rotating SECRET_KEY, or moving PORTAL_URL or the database, changes the prefix of the credentials
    issued afterwards only: the nodes keep the users named in their rows, and the sync keeps repairing those. Its
    removal of leftovers (users no node has) sees only the current prefix, so a leftover under an old one stays
    until removed by hand (``ACL USERS``, then ``ACL DELUSER`` of a name no node's ``broker_username`` holds;
    docs/operations.md, "Broker users named per portal")."""
    return prefix_for(
        portal_url=settings.PORTAL_URL, database=settings.DATABASES["default"], secret_key=settings.SECRET_KEY
    )


def prefix_for(*, portal_url: str, database: Mapping[str, Any], secret_key: str) -> str:
    if "sqlite" in database["ENGINE"]:
        where = str(Path(database["NAME"]).resolve())
    else:
        where = f"{database.get('HOST') or 'localhost'}:{database.get('PORT') or ''}/{database['NAME']}"
    identity = PREFIX_PURPOSE + f"\n{portal_url.rstrip('/')}\n{where}".encode()
    return f"gpubook-{hmac.new(secret_key.encode(), identity, hashlib.sha256).hexdigest()[:8]}."


def user_prefix() -> str:
    """This portal's prefix: NODE_BROKER_USER_PREFIX, or one derived from its identity."""
    return settings.NODE_BROKER_USER_PREFIX or default_user_prefix()


def broker_username(node_name: str) -> str:
    """The name this portal gives ``node_name``'s user now (an existing user keeps the one stored with its node)."""
    return f"{user_prefix()}{node_name}"


def own_node_name(username: str, prefix: str) -> str | None:
    """The node a Redis user named ``username`` would be under ``prefix``, or None when it is not one of ours
    (another portal's, a legacy ``node-<name>``, the portal's own login)."""
    head, dot, name = username.partition(".")
    if not dot or f"{head}." != prefix:
        return None
    try:
        validate_node_name(name)
    except ValidationError:
        return None
    return name


def new_password() -> str:
    return secrets.token_urlsafe(32)  # URL-safe: it goes into the BROKER_URL as it is


def password_hash(password: str) -> str:
    """The SHA-256 Redis ACLs compare a password with (``#<hex>``)."""
    return hashlib.sha256(password.encode()).hexdigest()


def agent_broker_url(*, username: str, password: str | None) -> str:
    """The BROKER_URL for a node's agent: AGENT_BROKER_URL with the node's user and password (or as it is,
    the portal's own credential, with ``password=None``)."""
    url = settings.AGENT_BROKER_URL
    if password is None:
        return url
    parts = urlsplit(url)
    address = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{username}:{password}@{address}"))


def broker_url_still_valid(node: Node, url: str) -> bool:
    """Whether ``url`` is the BROKER_URL ``node``'s agent was last given, under this portal's prefix (the demo
    keeps such configs, and gives a node whose user still has its name from before prefixes a new one)."""
    if not settings.NODE_BROKER_USERS:
        return url == settings.AGENT_BROKER_URL and not node.broker_password_hash
    password = urlsplit(url).password or ""
    return (
        bool(password and node.broker_password_hash)
        and password_hash(password) == node.broker_password_hash
        and node.broker_username == broker_username(node.name)
        and url == agent_broker_url(username=node.broker_username, password=password)
    )


def redis_database(url: str) -> int:
    """The database number of a redis:// URL (its path; 0 without one)."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def acl_rules(*, node_name: str, password_sha256: str) -> list[str]:
    """The whole of the node's user, from nothing (``reset``), so a re-run leaves exactly this.

    ``resetchannels`` comes after ``reset`` on purpose: with ``acl-pubsub-default allchannels`` a reset
    user may use every channel. ``+select`` only where needed: it lets the user pick any database, and
    the key pattern alone then keeps it to its own queue."""
    rules = ["reset", "on", f"#{password_sha256}", f"~{queue_name(node_name)}", "resetchannels", *AGENT_COMMANDS]
    if redis_database(settings.AGENT_BROKER_URL):
        rules.append("+select")
    return rules


def _shown(url: str) -> str:
    return str(maybe_sanitize_url(url))


def settings_problem() -> str | None:
    """What keeps per-node users from working whatever the server says, or None."""
    portal, agents = settings.NODE_BROKER_URL, settings.AGENT_BROKER_URL
    prefix = settings.NODE_BROKER_USER_PREFIX
    if prefix and not USER_PREFIX_PATTERN.match(prefix):
        return (
            f"NODE_BROKER_USER_PREFIX {prefix!r} is not a prefix for Redis user names: use up to 40 letters, digits, "
            "'-' and '_', then a '.' (e.g. 'gpubook-staging.'), or leave it empty for one derived from PORTAL_URL, "
            "the database and SECRET_KEY"
        )
    if urlsplit(portal).scheme not in REDIS_SCHEMES or urlsplit(agents).scheme not in REDIS_SCHEMES:
        return (
            "NODE_BROKER_USERS needs a Redis broker (redis:// or rediss://), and the nodes' broker is "
            f"{_shown(portal)} (the nodes: {_shown(agents)}): set NODE_BROKER_USERS=false and give each node a "
            "broker user of its own by hand (docs/agent.md, 'Other brokers')"
        )
    if redis_database(portal) != redis_database(agents):
        return (
            f"AGENT_BROKER_URL ({_shown(agents)}) names database {redis_database(agents)}, NODE_BROKER_URL "
            f"({_shown(portal)}) database {redis_database(portal)}: the nodes would watch queues nobody fills"
        )
    return None


@contextmanager
def _manager(action: str) -> Iterator[redis.Redis]:
    """The portal's own connection to the nodes' broker, with every failure turned into a BrokerUserError."""
    problem = settings_problem()
    if problem:
        raise BrokerUserError(problem)
    url = settings.NODE_BROKER_URL
    client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS)
    try:
        yield client
    except (redis.ConnectionError, redis.TimeoutError) as error:  # refused, timed out, or the portal's password refused
        raise BrokerUserError(f"cannot reach the broker at {_shown(url)} to {action}: {error}") from error
    except redis.ResponseError as error:
        raise BrokerUserError(_explain(error, url, action)) from error
    finally:
        client.close()


def _refused(error: BaseException) -> bool:
    """Whether Redis refused the portal's user the command (NOPERM), rather than failing it."""
    return isinstance(error, redis.exceptions.NoPermissionError) or str(error).startswith("NOPERM")


def _explain(error: redis.ResponseError, url: str, action: str) -> str:
    text = str(error)
    if _refused(error):
        text = text if text.startswith("NOPERM") else f"NOPERM {text}"  # redis-py drops the error code
        return (
            f"the broker at {_shown(url)} does not let the portal's Redis user {action} ({text}): allow that user "
            f"ACL and CLIENT KILL (ACL SETUSER <user> +acl +client|kill, docs/agent.md), {DISABLE_HINT}"
        )
    if "unknown command" in text.lower() or "unknown subcommand" in text.lower():
        return (
            f"the broker at {_shown(url)} has no ACL users (Redis 6.2 or later has them): upgrade Redis, {DISABLE_HINT}"
        )
    return f"the broker at {_shown(url)} refused to {action}: {text}"


def lock_broker_user(username: str) -> None:
    """Until the caller's transaction ends, keep the sync from taking ``username`` for a leftover: a node being
    registered has its user in Redis before its row is committed (nodes/services.py)."""
    advisory_xact_lock(f"broker-user:{username}")


def broker_user_set(
    *, username: str, node_name: str, password_sha256: str, end_sessions: bool, replaces: str = ""
) -> None:
    """Create or replace ``node_name``'s user ``username``; ``end_sessions`` also disconnects whoever is logged in
    as it (rotation: ``ACL SETUSER`` changes the password for new logins only); ``replaces`` names the node's
    user before, removed with its sessions (a name from before prefixes)."""
    with _manager(f"create the broker user {username}") as client:
        # One MULTI/EXEC: a portal user allowed ACL but not CLIENT KILL aborts both at queue time, rather than
        # leaving a new password in Redis that nobody holds while the database rolls back.
        pipe = client.pipeline(transaction=True)
        pipe.execute_command(
            "ACL", "SETUSER", username, *acl_rules(node_name=node_name, password_sha256=password_sha256)
        )
        if end_sessions:
            pipe.execute_command("CLIENT", "KILL", "USER", username)
        if replaces and replaces != username:
            pipe.execute_command("ACL", "DELUSER", replaces)
        pipe.execute()


def broker_user_delete(username: str) -> None:
    """Remove the user ``username``; Redis disconnects its sessions with it."""
    with _manager(f"remove the broker user {username}") as client:
        client.execute_command("ACL", "DELUSER", username)


def broker_users_forget(usernames: list[str]) -> None:
    """Once the deletion of the nodes these users belong to commits, remove the users too. Best effort: the sync
    removes a user of this portal's prefix left behind, and one with a name from before prefixes can take only the
    queue of a node nobody pushes to any more, and registering the name again replaces it."""
    usernames = [name for name in usernames if name]
    if not settings.NODE_BROKER_USERS or not usernames:
        return

    def forget() -> None:
        for username in usernames:
            try:
                broker_user_delete(username)
            except BrokerUserError as error:
                log.warning("the deleted node's broker user %s is left: %s", username, error)

    transaction.on_commit(forget)


def _as_mapping(reply: Any) -> dict[str, Any]:
    """ACL GETUSER's reply as {field: value}, text decoded: RESP3 sends a map, RESP2 a flat list."""
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, Mapping) else zip(reply[::2], reply[1::2], strict=True)
    return {_text(key): _decoded(value) for key, value in items}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decoded(value: Any) -> Any:
    return [_decoded(item) for item in value] if isinstance(value, list) else _text(value)


def _words(value: Any) -> set[str]:
    return {word for item in (value if isinstance(value, list) else [value]) for word in str(item).split()}


def _user_matches(reply: Any, *, node_name: str, password_sha256: str) -> bool:
    """Whether the user Redis has is exactly the one ``acl_rules`` makes (as Redis 7 reports it)."""
    user = _as_mapping(reply)
    if not user:
        return False
    rules = acl_rules(node_name=node_name, password_sha256=password_sha256)
    return (
        "on" in user.get("flags", [])
        and user.get("passwords") == [password_sha256]
        and _words(user.get("keys", "")) == {f"~{queue_name(node_name)}"}
        and _words(user.get("channels", "")) == set()
        and _words(user.get("commands", "")) == {rule for rule in rules if rule[0] in "+-"}
        and not user.get("selectors")
    )


@dataclass(frozen=True)
class SyncResult:
    checked: int = 0
    repaired: list[str] = field(default_factory=list)  # nodes whose user was re-created or put back
    removed: list[str] = field(default_factory=list)  # users of this portal's prefix that no node has
    leftovers_unchecked: str = ""  # why the leftovers were not looked for (the portal's user may not list users)


def broker_users_sync() -> SyncResult:
    """Make every node's broker user what its stored hash says: re-create those Redis lost (a restart
    without an ACL file), put back those someone changed; and remove the users under this portal's prefix
    that no node of its has (a deletion whose removal failed, a registration rolled back). No other user is
    touched: another portal's on the same Redis, a name from before prefixes that no node has, anyone's own.
    Idempotent; nothing to do costs one round trip.

    Each repair re-reads the node's user under its row lock, as rotation writes it: a sync that read the hash
    just before a rotation can never put the old password back. Each removal happens under the user's lock and
    after the database said again that no node has it: a node being registered has its user before its row
    is committed.

    A portal's Redis user that may not run ``ACL USERS`` (allowed only what registration needs) still gets every
    node's user repaired: only the leftovers are not looked for, with a warning (``leftovers_unchecked``)."""
    if not settings.NODE_BROKER_USERS:
        return SyncResult()
    prefix = user_prefix()
    repaired, removed = [], []
    with _manager("re-create the nodes' broker users") as client:
        nodes = list(
            Node.objects.exclude(broker_password_hash="")
            .exclude(broker_username="")
            .order_by("name")
            .values_list("pk", "name", "broker_username", "broker_password_hash")
        )
        with client.pipeline(transaction=False) as pipe:
            for _, _, username, _ in nodes:
                pipe.execute_command("ACL", "GETUSER", username)
            pipe.execute_command(*LISTING_COMMAND)
            # Each reply on its own: a refused ACL USERS must not cost the repairs.
            *found, users = pipe.execute(raise_on_error=False)
        for reply in found:
            if isinstance(reply, Exception):
                raise reply  # _manager says what the portal's user lacks
        unchecked = ""
        if isinstance(users, Exception):
            if not _refused(users):
                raise users
            unchecked = (
                f"the broker at {_shown(settings.NODE_BROKER_URL)} does not let the portal's Redis user list the "
                f"users ({users}): allow it ACL USERS (ACL SETUSER <user> +acl|users) for leftovers to be removed"
            )
            users = []
        for (pk, name, _, stored), reply in zip(nodes, found, strict=True):
            if _user_matches(reply, node_name=name, password_sha256=stored):
                continue
            with transaction.atomic():
                current = (
                    Node.objects.select_for_update()
                    .filter(pk=pk)
                    .values_list("name", "broker_username", "broker_password_hash")
                    .first()
                )
                if current is None or not current[1] or not current[2]:
                    continue
                client.execute_command(
                    "ACL", "SETUSER", current[1], *acl_rules(node_name=current[0], password_sha256=current[2])
                )
            repaired.append(current[0])
        known = {username for _, _, username, _ in nodes}
        for username in sorted(_text(user) for user in users):
            if username in known or own_node_name(username, prefix) is None:
                continue
            with transaction.atomic():
                lock_broker_user(username)
                if Node.objects.filter(broker_username=username).exclude(broker_password_hash="").exists():
                    continue
                client.execute_command("ACL", "DELUSER", username)
            removed.append(username)
    if repaired:
        log.warning("re-created or repaired the broker users of %s", ", ".join(repaired))
    if removed:
        log.warning("removed the broker users %s: no node of this portal has them", ", ".join(removed))
    if unchecked:
        log.warning("the broker users of this portal's prefix that no node has were not looked for: %s", unchecked)
    return SyncResult(checked=len(nodes), repaired=repaired, removed=removed, leftovers_unchecked=unchecked)


@dataclass(frozen=True)
class BrokerProbe:
    """What the broker says about per-node users, for the system checks (nothing is changed)."""

    reachable: bool = True
    error: str = ""
    acl_supported: bool = True
    user: str = ""
    missing: list[str] = field(default_factory=list)  # commands the portal's user may not run
    cannot_list: bool = False  # it may not run ACL USERS: the sync's leftovers stay
    default_user_open: bool = False  # Redis' default user is on and needs no password


def broker_probe() -> BrokerProbe:
    url = settings.NODE_BROKER_URL
    client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS)
    try:
        try:
            user = _text(client.execute_command("ACL", "WHOAMI"))
        except redis.ResponseError as error:
            if "unknown" in str(error).lower():
                return BrokerProbe(acl_supported=False, error=str(error))
            raise
        commands = (*MANAGER_COMMANDS, LISTING_COMMAND)
        try:
            refused = [
                command
                for command in commands
                if _text(client.execute_command("ACL", "DRYRUN", user, *command, *_probe_args(command))) != "OK"
            ]
        except redis.exceptions.NoPermissionError:
            refused = list(commands)
        except redis.ResponseError:  # Redis 6.2 has no DRYRUN: ask for something only ACL managers see
            try:
                client.execute_command("ACL", "GETUSER", user)
                refused = []
            except redis.exceptions.NoPermissionError:
                refused = list(commands)
        missing = [" ".join(command).lower() for command in refused if command != LISTING_COMMAND]
        default_open = False
        if not missing:
            default = _as_mapping(client.execute_command("ACL", "GETUSER", "default"))
            default_open = "on" in default.get("flags", []) and "nopass" in default.get("flags", [])
        return BrokerProbe(
            user=user, missing=missing, cannot_list=LISTING_COMMAND in refused, default_user_open=default_open
        )
    except (redis.ConnectionError, redis.TimeoutError) as error:
        return BrokerProbe(reachable=False, error=str(error))
    finally:
        client.close()


def _probe_args(command: tuple[str, str]) -> tuple[str, ...]:
    if command == ("ACL", "USERS"):
        return ()
    return ("USER", "node-probe") if command == ("CLIENT", "KILL") else ("node-probe",)
