"""A real LDAP directory for the tests: OpenLDAP's slapd (Debian's ``slapd`` package, which
scripts/services installs) on a free port, with its own database in a temporary folder, and its
statistics log kept so a test can count the binds the portal sent it."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.agent.harness import free_port, port_open, terminate, wait_for

SLAPD = shutil.which("slapd") or "/usr/sbin/slapd"
SUFFIX = "dc=example,dc=org"
ADMIN_DN = f"cn=admin,{SUFFIX}"
ADMIN_PASSWORD = "directory-admin-secret"
PEOPLE = f"ou=people,{SUFFIX}"

CONFIG = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/nis.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {root}/slapd.pid
database mdb
suffix "{suffix}"
rootdn "{admin}"
rootpw {password}
directory {root}/data
maxsize 10485760
"""


def available() -> bool:
    return Path(SLAPD).exists() and Path("/etc/ldap/schema/inetorgperson.schema").exists()


class Directory:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="slapd-"))
        self.port = free_port()
        self.uri = f"ldap://127.0.0.1:{self.port}"
        self.log_path = self.root / "slapd.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        (self.root / "data").mkdir()
        config = self.root / "slapd.conf"
        config.write_text(CONFIG.format(root=self.root, suffix=SUFFIX, admin=ADMIN_DN, password=ADMIN_PASSWORD))
        with self.log_path.open("wb") as log:
            # -d stats: stay in the foreground and log every connection and operation (each BIND).
            self.process = subprocess.Popen(  # noqa: S603 - fixed arguments
                [SLAPD, "-f", str(config), "-h", self.uri + "/", "-d", "stats"], stdout=log, stderr=subprocess.STDOUT
            )
        if not wait_for(lambda: port_open(self.port), timeout=15, interval=0.05):
            self.stop()
            raise RuntimeError(f"slapd did not start:\n{self.log()}")
        self._add_base_entries()
        self.marker = self.add_person("marker", "marker-password", given="Log", surname="Marker")

    def stop(self) -> None:
        terminate(self.process)
        self.process = None
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _connection(self, dn: str = ADMIN_DN, password: str = ADMIN_PASSWORD):
        import ldap

        connection = ldap.initialize(self.uri)
        connection.simple_bind_s(dn, password)
        return connection

    def _add_base_entries(self) -> None:
        connection = self._connection()
        connection.add_s(
            SUFFIX, [("objectClass", [b"dcObject", b"organization"]), ("o", [b"Example"]), ("dc", [b"example"])]
        )
        connection.add_s(PEOPLE, [("objectClass", [b"organizationalUnit"]), ("ou", [b"people"])])
        connection.unbind_s()

    def add_person(self, uid: str, password: str, *, given: str, surname: str) -> str:
        dn = f"uid={uid},{PEOPLE}"
        connection = self._connection()
        connection.add_s(
            dn,
            [
                ("objectClass", [b"inetOrgPerson"]),
                ("uid", [uid.encode()]),
                ("cn", [f"{given} {surname}".encode()]),
                ("givenName", [given.encode()]),
                ("sn", [surname.encode()]),
                ("mail", [f"{uid}@example.org".encode()]),
                ("userPassword", [password.encode()]),
            ],
        )
        connection.unbind_s()
        return dn

    def add_group(self, cn: str, members: list[str]) -> str:
        """A groupOfNames under the suffix with these member DNs (at least one: the schema wants it)."""
        dn = f"cn={cn},{SUFFIX}"
        connection = self._connection()
        connection.add_s(
            dn, [("objectClass", [b"groupOfNames"]), ("cn", [cn.encode()]), ("member", [m.encode() for m in members])]
        )
        connection.unbind_s()
        return dn

    def binds_as(self, dn: str) -> int:
        """How many times someone tried to bind (log in) as ``dn`` so far, rightly or not."""
        return len(re.findall(rf'BIND dn="{re.escape(dn)}" method=128', self.log()))

    def settle(self) -> None:
        """Wait until the log has caught up with everything asked so far: bind as an entry nobody else
        uses and wait for that bind to appear (slapd logs operations in the order they came)."""
        before = self.binds_as(self.marker)
        self._connection(self.marker, "marker-password").unbind_s()
        if not wait_for(lambda: self.binds_as(self.marker) > before, timeout=10, interval=0.02):
            raise RuntimeError("slapd's log did not show the marker bind")
