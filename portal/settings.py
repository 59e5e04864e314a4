"""The portal's one settings module. Everything is an environment variable with a default.

See docs/configuration.md for the list. The embedded default runs a whole lab on a SQLite file
under var/; set DATABASE_URL to use PostgreSQL.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import dj_email_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from kernel.db_pool import RECONNECT_SECONDS, try_again
from kernel.deployment import (
    is_machine_name,
    placeholder_names,
    placeholder_refusal,
    reached_from_elsewhere,
    secret_key_refusal,
    secret_key_weakness,
)
from kernel.env import envbool, envchoice, envfloat, envint, envlist, envstr

# A value copied from deploy/portal.env.example and never filled in is public: no process starts with one, not even
# `manage.py migrate` (kernel/deployment.py; docs/security.md, "Refused at start").
if _placeholders := placeholder_names(os.environ):
    raise ImproperlyConfigured(placeholder_refusal(_placeholders))

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """SECRET_KEY from the environment, or one generated once and kept under var/. One that can be guessed
    stops every process (Django's own deployment check only warns): feed URLs and sessions are signed with it."""
    key, source = envstr("SECRET_KEY"), "SECRET_KEY"
    if not key:
        key_file = VAR_DIR / "secret-key"
        if not key_file.exists():
            key_file.touch(mode=0o600)
            key_file.write_text(secrets.token_urlsafe(50))
        key, source = key_file.read_text().strip(), str(key_file)
    weakness = secret_key_weakness(key)
    if weakness:
        raise ImproperlyConfigured(secret_key_refusal(source, weakness))
    return key


SECRET_KEY = _secret_key()
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
# Names in ALLOWED_HOSTS that are this machine's all the same: its containers' (docker-compose's example answers to
# its service name, web), which no certificate can name. With localhost and loopback addresses they make a portal
# reached on this machine only, which `check --deploy` asks no https of (kernel/deployment.py).
LOCAL_HOST_NAMES = envlist("LOCAL_HOST_NAMES", ["web"])
if not all(is_machine_name(name) for name in LOCAL_HOST_NAMES):
    raise ImproperlyConfigured(
        f"LOCAL_HOST_NAMES={','.join(LOCAL_HOST_NAMES)}: list only names without a dot (this machine's containers, "
        "such as web); a name others can reach is never local."
    )
SITE_NAME = envstr("SITE_NAME", "GPU booking portal")
# How node agents and emails reach the portal.
PORTAL_URL = envstr("PORTAL_URL", "http://127.0.0.1:8000")

# Production behind a TLS-terminating reverse proxy (docs/security.md). An https PORTAL_URL turns on
# secure cookies and trusts its own origin for CSRF; the proxy headers are trusted only when asked,
# because a portal reached directly would otherwise believe whatever a client sends.
_portal = urlsplit(PORTAL_URL)
_https = _portal.scheme == "https"
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
if _https and f"https://{_portal.netloc}" not in CSRF_TRUSTED_ORIGINS:
    CSRF_TRUSTED_ORIGINS.append(f"https://{_portal.netloc}")
TRUST_X_FORWARDED_PROTO = envbool("TRUST_X_FORWARDED_PROTO", False)
if TRUST_X_FORWARDED_PROTO:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
USE_X_FORWARDED_HOST = envbool("USE_X_FORWARDED_HOST", False)
# On by default only when the portal can tell https requests apart (https URL and a trusted proxy
# header): without the header every request looks like http and the redirect would loop.
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", _https and TRUST_X_FORWARDED_PROTO)
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", _https)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", _https)
SESSION_COOKIE_HTTPONLY = True
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", SECURE_HSTS_SECONDS > 0)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = envstr("SECURE_REFERRER_POLICY", "same-origin")
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy on every response (django-csp, kernel/csp.py adds the websocket origin; docs/security.md).
# No inline script, style, event handler or eval anywhere: pages load their code from static/js/ and take their
# data from json_script or data- attributes. Scripts and styles come from the portal itself, data: only for the
# images of Swagger UI's stylesheet.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}
SILENCED_SYSTEM_CHECKS = envlist("SILENCED_SYSTEM_CHECKS", [])
if not SECURE_HSTS_PRELOAD:
    # Asking browsers to preload the domain is a separate, hard-to-undo decision (hstspreload.org),
    # not a default: not making it is no warning.
    SILENCED_SYSTEM_CHECKS.append("security.W021")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "axes",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "accounts",
    "audit",
    "nodes",
    "reservations",
    "live",
    "notifications",
    "accounting",
    "feeds",
    "alerts",
    "environments",
    "slurm",
    "fairshare",
    "waitlist",
    "metrics",
    # The shell itself, for its system checks (portal/checks.py).
    "portal.apps.PortalConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Near the top, so that every response carries the policy, whatever middleware below answered it.
    "kernel.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "accounts.middleware.UserTimezoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Turns a login refused because of a lockout into the page that says when to retry (accounts/throttling.py).
    "accounts.throttling.LoginLockoutMiddleware",
    # A login the directory (LDAP) could not check, on either login page: 503 and Retry-After (accounts/sso.py).
    "accounts.sso.DirectoryAwayMiddleware",
    # The database restarting, Redis away, a lock timeout: 503 with words and Retry-After, not 500 (kernel/outages.py).
    "kernel.outages.OutageMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Database: a SQLite file under var/ unless DATABASE_URL says otherwise.
DATABASES = {
    "default": dj_database_url.parse(
        envstr("DATABASE_URL", f"sqlite:///{VAR_DIR / 'portal.sqlite3'}"),
        conn_max_age=envint("DB_CONN_MAX_AGE", 0),
        # A kept connection (DB_CONN_MAX_AGE, or the pool's: psycopg_pool's check) is tried before a request uses
        # it and replaced when the database restarted meanwhile, so that no request fails on it (kernel/outages.py).
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite serializes writers. BEGIN IMMEDIATE takes the write lock when a transaction starts,
    # so the booking service's check-then-write runs with no other writer in between (the
    # PostgreSQL path gets the same from row locks plus the exclusion constraint).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and envint("DB_POOL_MAX_SIZE", 0) > 0:
    # A pool of connections per process (psycopg_pool; docker-compose turns it on): a request borrows one and
    # gives it back, instead of opening a PostgreSQL connection (a server process) for each request, and a
    # process never holds more than DB_POOL_MAX_SIZE however many request threads daphne runs (a request that
    # finds none free waits up to DB_POOL_TIMEOUT seconds, then fails). Off by default: a process whose
    # threads each hold a connection for long (the test suite's races) needs one per thread. Pools and
    # persistent connections exclude each other, so DB_CONN_MAX_AGE is ignored with it.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": envint("DB_POOL_MIN_SIZE", 1),
        "max_size": envint("DB_POOL_MAX_SIZE", 0),
        "timeout": envint("DB_POOL_TIMEOUT", 10),
        # After a database restart, try again about once a second rather than with a doubling delay (kernel/db_pool.py).
        "reconnect_timeout": RECONNECT_SECONDS,
        "reconnect_failed": try_again,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "accounts.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "calendar"
LOGOUT_REDIRECT_URL = "login"

# The unix username names the account on the GPU nodes that receives booked GPUs, so who may set it
# is a security decision (docs/security.md): "directory" (the LDAP attribute or OIDC claim at each
# login, never editable in the portal), "admin" (only admins set it), or "request" (a researcher
# proposes one, an admin confirms it; nothing is granted until then). With institutional login on,
# the directory is the natural authority, so it is the default there.
UNIX_USERNAME_SOURCES = ("request", "admin", "directory")
UNIX_USERNAME_SOURCE = envchoice(
    "UNIX_USERNAME_SOURCE",
    # OIDC counts only with a unix username claim named: no claim is safe to assume (see below).
    "directory"
    if envstr("LDAP_SERVER_URI") or (envstr("OIDC_RP_CLIENT_ID") and envstr("OIDC_UNIX_USERNAME_CLAIM"))
    else "request",
    UNIX_USERNAME_SOURCES,
)
# Names the portal never accepts as a unix username, whoever sets them: system and service accounts.
# The node agent has the final word (it refuses accounts it does not know or whose uid is below
# UID_MIN); this list catches the obvious ones before anyone books with them.
UNIX_USERNAME_DENYLIST = frozenset(
    envlist(
        "UNIX_USERNAME_DENYLIST",
        [
            *("root", "toor", "admin", "administrator", "daemon", "bin", "sys", "sync", "games", "man", "lp"),
            *("mail", "news", "uucp", "proxy", "www-data", "backup", "list", "irc", "gnats", "nobody"),
            *("nogroup", "systemd-network", "systemd-resolve", "systemd-timesync", "systemd-coredump"),
            *("messagebus", "syslog", "sshd", "polkitd", "avahi", "colord", "dnsmasq", "ntp", "chrony"),
            *("postgres", "mysql", "redis", "rabbitmq", "memcache", "mongodb", "elasticsearch", "nginx"),
            *("apache", "httpd", "munge", "slurm", "nvidia-persistenced", "dcgm", "nvidia-dcgm", "docker"),
            *("gpubook", "celery", "_apt", "ftp", "operator", "halt", "shutdown", "tss", "uuidd"),
        ],
    )
)

# Institutional login (docs/security.md), off unless configured; the packages come with the `sso`
# extra. Local accounts (ModelBackend) keep working either way. django-axes comes first: a locked-out
# login is refused before any backend checks a password, so none is relayed to an LDAP directory.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]

# Login throttling (django-axes; accounts/throttling.py, docs/security.md). LOGIN_FAILURE_LIMIT failed
# logins for one username, or from one client address, lock that username or address out until
# LOGIN_LOCKOUT_MINUTES after the last counted failure; attempts during a lockout are refused
# without being counted, so the time the page names holds. Failures are counted in the database (axes'
# database handler), so every web process sees the same count, on PostgreSQL and SQLite alike.
LOGIN_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", 5)
LOGIN_LOCKOUT_MINUTES = envint("LOGIN_LOCKOUT_MINUTES", 15)
if LOGIN_FAILURE_LIMIT < 1 or LOGIN_LOCKOUT_MINUTES < 1:
    raise ImproperlyConfigured("LOGIN_FAILURE_LIMIT and LOGIN_LOCKOUT_MINUTES must be at least 1.")
# Failed API tokens (Authorization: Bearer) from one client address within a minute, after which that
# address gets 429 with Retry-After until the minute is over (counted in Redis, shared by every process).
API_TOKEN_FAILURES_PER_MINUTE = envint("API_TOKEN_FAILURES_PER_MINUTE", 20)
# Reverse proxies in front of the portal that append the client's address to X-Forwarded-For. Behind a
# proxy REMOTE_ADDR is the proxy's own address, so per-address lockouts would lock out everyone at once;
# with NUM_PROXIES=1 the client is the address the proxy appended. 0: REMOTE_ADDR, and the header is
# ignored, since a client can write anything in it.
NUM_PROXIES = envint("NUM_PROXIES", 0)
if NUM_PROXIES < 0:
    raise ImproperlyConfigured("NUM_PROXIES must be 0 or more.")
if not reached_from_elsewhere(
    portal_url=PORTAL_URL,
    allowed_hosts=ALLOWED_HOSTS,
    local_names=LOCAL_HOST_NAMES,
    csrf_trusted_origins=CSRF_TRUSTED_ORIGINS,
    trust_x_forwarded_proto=TRUST_X_FORWARDED_PROTO,
    use_x_forwarded_host=USE_X_FORWARDED_HOST,
    num_proxies=NUM_PROXIES,
):
    # A portal reached on this machine only (scripts/run, docker-compose's example: an http PORTAL_URL on localhost,
    # no name but local ones and LOCAL_HOST_NAMES, no proxy in front) has no https to insist on, and secure cookies
    # would log nobody in. Once others reach it, `check --deploy` asks for all four (docs/security.md).
    SILENCED_SYSTEM_CHECKS += ["security.W004", "security.W008", "security.W012", "security.W016"]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=LOGIN_LOCKOUT_MINUTES)
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_PARAMETERS = "accounts.throttling.lockout_parameters"
AXES_USERNAME_CALLABLE = "accounts.throttling.lockout_username"
AXES_CLIENT_IP_CALLABLE = "accounts.throttling.client_address"
AXES_LOCKOUT_CALLABLE = "accounts.throttling.lockout_response"
# accounts.throttling.LoginLockoutMiddleware stands in for axes' own middleware (see there why); axes
# checks for its own by name.
SILENCED_SYSTEM_CHECKS.append("axes.W002")
# Successful logins are not logged to the database (that table would only grow); failures are, until
# they expire. An OIDC callback's code and state never are.
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False  # no banner at every start; failures and lockouts are still logged as warnings
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "code", "state"]


def _sso_import(package: str, variable: str) -> None:
    try:
        __import__(package)
    except ImportError:
        raise ImproperlyConfigured(f"{variable} is set but {package} is not installed: pip install '.[sso]'") from None


def _require(*names: str) -> None:
    missing = [name for name in names if not globals()[name]]
    if missing:
        raise ImproperlyConfigured(f"Institutional login needs {', '.join(missing)} as well.")


# LDAP: the password form asks the directory (django-auth-ldap), searching the user's entry with a
# service account, then binding as the user.
LDAP_SERVER_URI = envstr("LDAP_SERVER_URI")
LDAP_UNIX_USERNAME_ATTR = envstr("LDAP_UNIX_USERNAME_ATTR", "uid")
if LDAP_SERVER_URI:
    _sso_import("django_auth_ldap", "LDAP_SERVER_URI")
    import ldap
    from django_auth_ldap import config as _ldap

    LDAP_USER_SEARCH_BASE = envstr("LDAP_USER_SEARCH_BASE")
    _require("LDAP_USER_SEARCH_BASE")
    AUTH_LDAP_SERVER_URI = LDAP_SERVER_URI
    AUTH_LDAP_START_TLS = envbool("LDAP_START_TLS", False)
    AUTH_LDAP_BIND_DN = envstr("LDAP_BIND_DN")
    AUTH_LDAP_BIND_PASSWORD = envstr("LDAP_BIND_PASSWORD")
    AUTH_LDAP_USER_SEARCH = _ldap.LDAPSearch(
        LDAP_USER_SEARCH_BASE, ldap.SCOPE_SUBTREE, envstr("LDAP_USER_SEARCH_FILTER", "(uid=%(user)s)")
    )
    AUTH_LDAP_USER_ATTR_MAP = {
        "first_name": envstr("LDAP_ATTR_FIRST_NAME", "givenName"),
        "last_name": envstr("LDAP_ATTR_LAST_NAME", "sn"),
        "email": envstr("LDAP_ATTR_EMAIL", "mail"),
    }
    # Members of this group (a DN) are staff, that is booking admins; everyone else is not.
    LDAP_STAFF_GROUP = envstr("LDAP_STAFF_GROUP")
    # With this group (a DN) set, only its members may log in: a login that finds someone outside it
    # deactivates the account, which ends their bookings (accounts/signals.py).
    LDAP_ACTIVE_GROUP = envstr("LDAP_ACTIVE_GROUP")
    if LDAP_STAFF_GROUP or LDAP_ACTIVE_GROUP:
        AUTH_LDAP_GROUP_SEARCH = _ldap.LDAPSearch(
            envstr("LDAP_GROUP_SEARCH_BASE", LDAP_USER_SEARCH_BASE),
            ldap.SCOPE_SUBTREE,
            envstr("LDAP_GROUP_SEARCH_FILTER", "(objectClass=groupOfNames)"),
        )
        _group_types = {
            "groupOfNames": _ldap.GroupOfNamesType,
            "groupOfUniqueNames": _ldap.GroupOfUniqueNamesType,
            "posixGroup": _ldap.PosixGroupType,
        }
        _group_type = envchoice("LDAP_GROUP_TYPE", "groupOfNames", tuple(_group_types))
        AUTH_LDAP_GROUP_TYPE = _group_types[_group_type]()
        AUTH_LDAP_USER_FLAGS_BY_GROUP = {
            flag: group for flag, group in (("is_staff", LDAP_STAFF_GROUP), ("is_active", LDAP_ACTIVE_GROUP)) if group
        }
    AUTHENTICATION_BACKENDS.insert(1, "accounts.sso_ldap.PortalLDAPBackend")  # after axes
    # Last: a directory out of reach is said so (503), once the local accounts have had their try, and not
    # counted as a failed login (accounts/sso_ldap.py).
    AUTHENTICATION_BACKENDS.append("accounts.sso_ldap.DirectoryAwayBackend")

# OpenID Connect: an "institutional login" button on the login page (mozilla-django-oidc, code flow
# with PKCE). Endpoints are given explicitly: the provider's /.well-known/openid-configuration lists
# them. Users are created and updated from the claims (accounts/sso_oidc.py).
OIDC_RP_CLIENT_ID = envstr("OIDC_RP_CLIENT_ID")
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_LOGIN_LABEL = envstr("OIDC_LOGIN_LABEL", "Institutional login")
OIDC_USERNAME_CLAIM = envstr("OIDC_USERNAME_CLAIM", "preferred_username")
# No default: the username claim is editable at some providers, and someone who renamed themselves
# to a colleague's unix account would have the nodes open it to them. Name a directory-backed claim.
OIDC_UNIX_USERNAME_CLAIM = envstr("OIDC_UNIX_USERNAME_CLAIM")
OIDC_GROUPS_CLAIM = envstr("OIDC_GROUPS_CLAIM", "groups")
# Upgrade aid, off by default (accounts/sso_oidc.py): link a first-seen subject to an existing
# password-less, non-staff account of the same username, as the username-claim login of earlier
# versions made them. Turn it on for the first logins after an upgrade, then off.
OIDC_LINK_BY_USERNAME = envbool("OIDC_LINK_BY_USERNAME", False)
OIDC_STAFF_GROUPS = envlist("OIDC_STAFF_GROUPS", [])
# A provider out of reach is said so on the login page instead of a 500 (accounts/sso_oidc.py). Read when
# mozilla-django-oidc's URLs load; harmless without OIDC (nothing imports it then).
OIDC_CALLBACK_CLASS = "accounts.sso_oidc.PortalOIDCCallbackView"
if OIDC_ENABLED:
    _sso_import("mozilla_django_oidc", "OIDC_RP_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = envstr("OIDC_RP_CLIENT_SECRET")
    OIDC_OP_AUTHORIZATION_ENDPOINT = envstr("OIDC_OP_AUTHORIZATION_ENDPOINT")
    OIDC_OP_TOKEN_ENDPOINT = envstr("OIDC_OP_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = envstr("OIDC_OP_USER_ENDPOINT")
    OIDC_OP_JWKS_ENDPOINT = envstr("OIDC_OP_JWKS_ENDPOINT")
    OIDC_RP_SIGN_ALGO = envstr("OIDC_RP_SIGN_ALGO", "RS256")
    OIDC_RP_SCOPES = envstr("OIDC_RP_SCOPES", "openid email profile")
    _require(
        "OIDC_RP_CLIENT_SECRET", "OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT"
    )
    if OIDC_RP_SIGN_ALGO.startswith(("RS", "ES")):
        _require("OIDC_OP_JWKS_ENDPOINT")
    OIDC_USE_PKCE = True
    LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/"
    AUTHENTICATION_BACKENDS.append("accounts.sso_oidc.PortalOIDCBackend")

LANGUAGE_CODE = "en-us"
TIME_ZONE = envstr("TIME_ZONE", "UTC")
# The currency of the tariffs' prices (accounting.Tariff): reports and booking pages show cost in it.
TARIFF_CURRENCY = envstr("TARIFF_CURRENCY", "EUR")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(envstr("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
# STATIC_MANIFEST=true (production, after collectstatic): file names carry a content hash and
# WhiteNoise serves them with far-future cache headers. Off by default: tests and a fresh checkout
# run without collectstatic, and the manifest storage refuses any file it has not collected.
STATIC_MANIFEST = envbool("STATIC_MANIFEST", False)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if STATIC_MANIFEST
        else "whitenoise.storage.CompressedStaticFilesStorage"
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Scripts and the browser both send JSON; one parser means one set of failure modes.
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "kernel.pagination.Pagination",
    "PAGE_SIZE": 100,
    "DEFAULT_THROTTLE_CLASSES": ["kernel.throttling.TokenRateThrottle", "rest_framework.throttling.AnonRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "user": envstr("API_RATE_PER_TOKEN", "1200/minute"),
        "anon": envstr("API_RATE_ANONYMOUS", "60/minute"),
        "agent": envstr("API_RATE_PER_AGENT", "600/minute"),
    },
    # The anonymous rate is per client address: the same address the login lockouts use (NUM_PROXIES).
    "NUM_PROXIES": NUM_PROXIES,
    "EXCEPTION_HANDLER": "kernel.api.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DATETIME_FORMAT": "iso-8601",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU booking portal API",
    "DESCRIPTION": "Book shared GPUs. Authenticate with 'Authorization: Bearer <token>'. "
    'Every error is {"error": {"code", "message", "details"}}.',
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Several components have a "status" field: name the node's and the booking's choice sets.
    "ENUM_NAME_OVERRIDES": {
        "NodeStatusEnum": "nodes.models.Node.Status",
        "ReservationStatusEnum": "reservations.models.Reservation.Status",
    },
}

REDIS_URL = envstr("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL", REDIS_URL)
# The cache holds the API's and the feeds' rate limits: in Redis, so that every web process counts the same
# requests (kernel/cache.py; docs/operations.md, "Scaling out"). A Redis that is away is forgiven.
CACHES = {
    "default": {
        "BACKEND": "kernel.cache.ForgivingRedisCache",
        "LOCATION": envstr("CACHE_URL", REDIS_URL),
        "KEY_PREFIX": envstr("CACHE_KEY_PREFIX", "gpubook-cache"),
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker killed mid-task leaves nothing half-done (docs/operations.md, "A worker killed mid-task"): every task
# is idempotent (each writes in its own transactions, mail and alerts are claimed by a compare-and-swap, a push
# sends a node's whole state), so a task is acknowledged only once it has run. A pool process killed under a task
# (the OOM killer) gives it back at once only where the task says so (`reject_on_worker_lost=True`: the short
# ones bounded by one node or booking that nothing else would redo soon, such as a node's lease push); anywhere
# else, a task that kills its process every time (an OOM in a large prune or rollup) would come back at once,
# forever, and starve the worker. The others are dropped as failed, and beat's next run of the periodic job does
# the same work. A whole worker killed holds its task unacknowledged in Redis until
# CELERY_VISIBILITY_TIMEOUT_SECONDS have passed, then any worker runs it (or drops it, when its `expires` has
# passed). Keep it above the longest task and the longest countdown (under a second here), or Redis hands a
# running task out twice.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": envint("CELERY_VISIBILITY_TIMEOUT_SECONDS", 3600)}

# Node agents (docs/architecture.md, "leases"). Pushes of a node's leases coalesce over this many
# milliseconds; a queued snapshot nobody took within the expiry is dropped (the next push replaces it).
LEASE_PUSH_COALESCE_SECONDS = envint("LEASE_PUSH_COALESCE_MS", 200) / 1000
LEASE_PUSH_EXPIRES_SECONDS = envint("LEASE_PUSH_EXPIRES_SECONDS", 120)
# The status cards a booking changed are rebuilt by a worker, coalescing the changes of this many
# milliseconds (live/status.py); 0 builds them in the request that booked, at once.
LIVE_STATUS_COALESCE_SECONDS = envint("LIVE_STATUS_COALESCE_MS", 250) / 1000
# A node whose agent has not reported for this long is shown offline.
AGENT_OFFLINE_AFTER_SECONDS = envint("AGENT_OFFLINE_AFTER_SECONDS", 40)
# The nodes' broker (nodes/node_broker.py; docs/agent.md, "A broker of the nodes' own"): the Redis the portal
# publishes lease snapshots to (queue node.<name>) and the agents consume from, as the portal reaches it. Redis
# cannot cap connections per user, so one node's credential can open connections until maxclients: on a Redis
# of its own that delays only lease pushes, which the agents' HTTPS pull covers, where on the portal's Redis it
# would stop the portal's tasks, cache, websockets and telemetry queue. The portal's own tasks stay on
# CELERY_BROKER_URL. Default: the portal's broker, which keeps a one-Redis lab (and the demo) working;
# `manage.py check --deploy` warns (nodes.W004) unless NODE_BROKER_SHARED says the lab accepts that.
NODE_BROKER_URL = envstr("NODE_BROKER_URL", CELERY_BROKER_URL)
NODE_BROKER_SHARED = envbool("NODE_BROKER_SHARED", False)
# A broker credential per node (nodes/broker_users.py, docs/agent.md "The broker"): register_node and the
# admin's "Issue new agent credentials" make each node a Redis ACL user that can take its own queue and
# nothing else, through the portal's connection to the nodes' broker (NODE_BROKER_URL), which must be allowed
# to manage ACL users. false: every agent gets AGENT_BROKER_URL as it is, the portal's own credential for the
# nodes' broker, which opens every queue to every node; only for a lab that trusts all its nodes, or a broker
# that is not Redis (whose per-node users the operator then makes by hand, as docs/agent.md says).
NODE_BROKER_USERS = envbool("NODE_BROKER_USERS", True)
# What this portal's node broker users' names start with (nodes/broker_users.py): Redis ACL users belong to a
# whole server, so two portals on one Redis (production and staging, a test run beside the demo) keep apart by
# it, and the sync removes only users under its own prefix. Letters, digits, '-' and '_', then a '.'. Empty:
# an HMAC under SECRET_KEY of PORTAL_URL and the database (broker_users.default_user_prefix), stable across
# restarts; rotating SECRET_KEY changes it for credentials issued afterwards (docs/operations.md).
NODE_BROKER_USER_PREFIX = envstr("NODE_BROKER_USER_PREFIX", "")
# The nodes' broker as the nodes reach it, when that differs from the portal's own address for it (the portal
# on 127.0.0.1, the nodes over the network); with NODE_BROKER_USERS its user and password are replaced
# by the node's own, and its query (rediss:// options such as ssl_ca_certs) is kept.
AGENT_BROKER_URL = envstr("AGENT_BROKER_URL", NODE_BROKER_URL)

# Mail (notifications/, alerts): EMAIL_URL as dj-email-url reads it, e.g.
# smtp://user:password@mail.example.org:587/?tls=True; the default prints mails on the console.
_email = dj_email_url.parse(envstr("EMAIL_URL", "console:"))
EMAIL_BACKEND = _email["EMAIL_BACKEND"]
EMAIL_HOST = _email["EMAIL_HOST"] or "localhost"
EMAIL_PORT = _email["EMAIL_PORT"] or 25
EMAIL_HOST_USER = _email["EMAIL_HOST_USER"] or ""
EMAIL_HOST_PASSWORD = _email["EMAIL_HOST_PASSWORD"] or ""
EMAIL_USE_TLS = _email["EMAIL_USE_TLS"]
EMAIL_USE_SSL = _email["EMAIL_USE_SSL"]
EMAIL_TIMEOUT = _email["EMAIL_TIMEOUT"] or 10
EMAIL_FILE_PATH = _email["EMAIL_FILE_PATH"] or str(VAR_DIR / "mail")
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "GPU booking portal <gpus@localhost>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL

# Live updates over websockets (live/), through Redis. The pub/sub layer of channels-redis: a
# broadcast is one PUBLISH that each web process fans out to its own connections in memory, where
# the list-based core layer writes one Redis entry per connection (500 pages: 500 writes, then 500
# reads; bench/live.py measured both). Delivery is at most once, as for any live view: a page
# that was away resynchronises from the snapshot it gets when it reconnects. redis-py 8 would time
# an idle reader out after 5 s: socket_timeout None keeps it.
# Redis pub/sub ignores database numbers: two portals (or a portal and its tests) sharing one Redis
# would hear each other, so the channel names carry a prefix, by default the database number.
CHANNEL_LAYER_URL = envstr("CHANNEL_LAYER_URL", REDIS_URL)
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {
            "hosts": [{"address": CHANNEL_LAYER_URL, "socket_timeout": None}],
            "prefix": envstr("CHANNEL_LAYER_PREFIX", f"gpubook{urlsplit(CHANNEL_LAYER_URL).path.strip('/') or '0'}."),
        },
    }
}
# Telemetry stored by a web process (TELEMETRY_INGEST=inline, or Redis away) reaches the pages in batches at
# most this often (live.broadcast._TelemetryBatch): the first report after a quiet spell goes at once, a burst
# goes together. The ingest process's batches are paced by TELEMETRY_BATCH_WAIT_MS instead.
LIVE_TELEMETRY_BATCH_MS = envint("LIVE_TELEMETRY_BATCH_MS", 100)
# How often a connection checks again that its user is still active and its token unrevoked.
LIVE_RECHECK_SECONDS = envint("LIVE_RECHECK_SECONDS", 60)
# How often beat refreshes the status pages: silent nodes turn offline (within this much more than
# AGENT_OFFLINE_AFTER_SECONDS), and cards where a slot or maintenance began or ended are re-sent.
STATUS_REFRESH_SECONDS = envint("STATUS_REFRESH_SECONDS", 10)

# Mail to researchers (notifications/): beat looks for due mails (slot starting, ending soon,
# ended) this often; an "ended" mail missed while the portal was down still goes this long after.
NOTIFY_SCAN_SECONDS = envint("NOTIFY_SCAN_SECONDS", 60)
NOTIFY_ENDED_CATCHUP_HOURS = envint("NOTIFY_ENDED_CATCHUP_HOURS", 6)
# Every mail waits in an outbox (notifications.Notification) until a sender claims and sends it. A
# claim lasts this long: a sender that died after claiming (a killed worker, a crash mid-send) has
# its mail sent again once the claim expires, so mail goes at least once. Longer than the slowest
# send (EMAIL_TIMEOUT per SMTP step; checked by notifications.E001), short enough not to delay much.
NOTIFY_CLAIM_SECONDS = envint("NOTIFY_CLAIM_SECONDS", 300)

# Telemetry reports: "queue" (the endpoint queues them in a Redis stream and answers; the ingest process,
# manage.py consume_telemetry, stores them in batches of up to TELEMETRY_BATCH_REPORTS) or "inline"
# (the web process stores each one before answering: no ingest process needed, about a third of the
# throughput). Past TELEMETRY_QUEUE_MAX queued reports the endpoint answers 503 (nodes/telemetry_queue.py).
# Needs Redis 6.2 or later.
TELEMETRY_INGEST = envchoice("TELEMETRY_INGEST", "queue", ("queue", "inline"))
TELEMETRY_BATCH_REPORTS = envint("TELEMETRY_BATCH_REPORTS", 500)
# A caught-up ingest process gathers the next batch for this long after the last one began (a report after a
# quiet spell is stored at once): fewer, larger transactions under a steady stream. Each stored batch goes to
# the pages at once, as one message: this also paces the pages.
TELEMETRY_BATCH_WAIT_MS = envint("TELEMETRY_BATCH_WAIT_MS", 100)
TELEMETRY_QUEUE_MAX = envint("TELEMETRY_QUEUE_MAX", 100_000)
# ... or past this much of Redis' memory (Redis' estimate): a report may carry up to 256 GPUs' processes.
TELEMETRY_QUEUE_MAX_MB = envint("TELEMETRY_QUEUE_MAX_MB", 256)

# Telemetry down-sampled per GPU per minute (nodes/usage.py) is kept this long; per hour
# (accounting/) for good.
TELEMETRY_MINUTES_KEEP_DAYS = envint("TELEMETRY_MINUTES_KEEP_DAYS", 30)
# What node agents report as events (nodes.NodeEvent) is kept this long, pruned hourly (0: for good).
NODE_EVENTS_KEEP_DAYS = envint("NODE_EVENTS_KEEP_DAYS", 90)
# Events stored per node per minute; past that they are counted (AgentState.events_dropped,
# /metrics), not stored, so a broken or hostile agent cannot fill the database. The events that
# drain GPUs and open alerts still act (nodes/ingest.py). A healthy node sends a few a minute.
NODE_EVENTS_PER_MINUTE = envint("NODE_EVENTS_PER_MINUTE", 600)
# A minute counts as "used" in the usage reports when its mean utilisation reaches this.
USAGE_USED_THRESHOLD_PCT = envint("USAGE_USED_THRESHOLD_PCT", 10)
# The longest period one usage report may cover.
REPORT_MAX_DAYS = envint("REPORT_MAX_DAYS", 400)
# How often beat rolls the recent minutes up into hours (accounting/rollup.py).
USAGE_ROLLUP_SECONDS = envint("USAGE_ROLLUP_SECONDS", 300)

# Alerts for admins (alerts/, docs/alerts.md). A GPU at or above this temperature (or its own
# slowdown threshold, if lower) on two readings in a row opens an alert.
ALERT_TEMPERATURE_C = envint("ALERT_TEMPERATURE_C", 85)
# A booked GPU under this utilisation for this many minutes is idle: its holder is told.
ALERT_IDLE_UTILIZATION_PCT = envint("ALERT_IDLE_UTILIZATION_PCT", 5)
ALERT_IDLE_MINUTES = envint("ALERT_IDLE_MINUTES", 30)
# Release an idle booking this many minutes after its holder was told, if still idle (0: never).
IDLE_AUTO_RELEASE_MINUTES = envint("IDLE_AUTO_RELEASE_MINUTES", 0)
# Staff (is_staff, with an email) get alert mail; these addresses too.
ALERT_EMAILS = envlist("ALERT_EMAILS", [])
# At most this many alert mails per kind per hour; the rest wait and go together in one summary.
ALERT_MAILS_PER_KIND_PER_HOUR = envint("ALERT_MAILS_PER_KIND_PER_HOUR", 5)
# Is beat alive? Each periodic job records its last success; agent heartbeats check, at most this
# often per process, that none is more than three periods late (alerts/jobs.py): a check that
# must not depend on beat itself. 0 checks at every heartbeat (tests).
JOBS_LATE_CHECK_SECONDS = envint("JOBS_LATE_CHECK_SECONDS", 30)

# /metrics for Prometheus (metrics/, docs/metrics.md). A scrape is let in by its bearer token
# (METRICS_TOKEN, or METRICS_TOKEN_FILE) or by its address (METRICS_ALLOWED_IPS: addresses or CIDRs,
# matched against REMOTE_ADDR, never X-Forwarded-For); with neither set, every scrape is refused.
METRICS_TOKEN = envstr("METRICS_TOKEN")
METRICS_ALLOWED_IPS = envlist("METRICS_ALLOWED_IPS", [])

# Booking rules that are settings rather than per-group limits (see docs/booking-rules.md).
BOOKING_GRID_MINUTES = envint("BOOKING_GRID_MINUTES", 15)
# The availability finder (and the suggestions) offer, of windows that start together, one on a node already
# in use first: whole nodes stay idle longer (the reports' fully idle node-hours).
AVAILABILITY_PACK_NODES = envbool("AVAILABILITY_PACK_NODES", False)
# The suggestions rank free slots by how busy those hours of the week were over this many past weeks.
SUGGEST_HISTORY_WEEKS = envint("SUGGEST_HISTORY_WEEKS", 8)
BOOKING_LOCK_TIMEOUT_MS = envint("BOOKING_LOCK_TIMEOUT_MS", 10_000)
# Slurm clusters (docs/slurm.md): how to run scontrol, an argument list as a shell would split it (never run by
# one), e.g. "ssh -- slurm-ctl scontrol" for a controller elsewhere; and how long before a booking's start its
# reservation is made in Slurm (0: as soon as it is approved).
SLURM_SCONTROL = envstr("SLURM_SCONTROL", "scontrol")
SLURM_RESERVATION_LEAD_HOURS = envint("SLURM_RESERVATION_LEAD_HOURS", 0)
# Or slurmrestd (Slurm 25.05 on: its v0.0.43 API writes reservations), used instead of scontrol when its URL is set:
# the URL (http://slurm-ctl:6820), the user the token is for, and the token (a JWT: `scontrol token`).
SLURM_RESTD_URL = envstr("SLURM_RESTD_URL", "")
SLURM_RESTD_USER = envstr("SLURM_RESTD_USER", "")
SLURM_RESTD_TOKEN = envstr("SLURM_RESTD_TOKEN", "")
# A token file is read again at every pass: a renewed token is used without a restart.
SLURM_RESTD_TOKEN_FILE = envstr("SLURM_RESTD_TOKEN_FILE", "")
# How to run sacct (the same form as SLURM_SCONTROL): the usage of bookings on Slurm nodes is read from the jobs in
# their reservations where the cluster's accounting is on.
SLURM_SACCT = envstr("SLURM_SACCT", "sacct")
# An alert opens once the controller has not answered the reconcile passes for this long (they run every minute).
SLURM_UNREACHABLE_ALERT_MINUTES = envint("SLURM_UNREACHABLE_ALERT_MINUTES", 10)
BOOKING_PURPOSE_MAX_LENGTH = 500
# Site ceilings for researchers' bookings and extensions, applied wherever no Limit row (site,
# group or user) sets that field: without them a fresh portal let anyone book a GPU until the year
# 9999. A Limit row raises or lowers them; admins book past both (docs/booking-rules.md).
MAX_DAYS_AHEAD = envint("MAX_DAYS_AHEAD", 90)  # a booking ends at most this many days from now
MAX_SLOT_HOURS = envint("MAX_SLOT_HOURS", 168)  # the longest one booking may be (a week)

# Recurring bookings (reservations/series.py, docs/booking-rules.md "Series"): the most occurrences one
# series may have, and how many days after its first day its last may fall.
SERIES_MAX_OCCURRENCES = envint("SERIES_MAX_OCCURRENCES", 200)
SERIES_MAX_DAYS = envint("SERIES_MAX_DAYS", 366)

# Reserved capacity (reservations/reserved.py, docs/booking-rules.md "Reserved capacity"): how many hours before
# an occurrence's start a reserved window releases to everyone when it sets no hours of its own (0: never).
RESERVED_RELEASE_HOURS = envint("RESERVED_RELEASE_HOURS", 0)

# Fair share (fairshare/, docs/booking-rules.md "Fair share"): usage halves every FAIRSHARE_HALF_LIFE_DAYS and is
# read back FAIRSHARE_LOOKBACK_HALF_LIVES half-lives; a used GPU-hour counts FAIRSHARE_USED_WEIGHT on top of its
# booked hour; a group without a GroupShare has FAIRSHARE_DEFAULT_SHARES. With FAIRSHARE_HORIZON_CAP on, a person
# whose factor is under FAIRSHARE_HORIZON_CAP_BELOW books at most FAIRSHARE_HORIZON_CAP_DAYS ahead.
FAIRSHARE_HALF_LIFE_DAYS = envint("FAIRSHARE_HALF_LIFE_DAYS", 7)
FAIRSHARE_LOOKBACK_HALF_LIVES = envint("FAIRSHARE_LOOKBACK_HALF_LIVES", 8)
FAIRSHARE_USED_WEIGHT = envfloat("FAIRSHARE_USED_WEIGHT", 1.0)
FAIRSHARE_DEFAULT_SHARES = envint("FAIRSHARE_DEFAULT_SHARES", 1)
FAIRSHARE_HORIZON_CAP = envbool("FAIRSHARE_HORIZON_CAP", False)
FAIRSHARE_HORIZON_CAP_BELOW = envfloat("FAIRSHARE_HORIZON_CAP_BELOW", 0.25)
FAIRSHARE_HORIZON_CAP_DAYS = envint("FAIRSHARE_HORIZON_CAP_DAYS", 2)

# The waitlist (waitlist/, docs/booking-rules.md "Waitlist"): how long a slot on offer waits for its claim,
# how many open entries one person may have, and the most GPUs one entry may wait for.
WAITLIST_CLAIM_MINUTES = envint("WAITLIST_CLAIM_MINUTES", 15)
WAITLIST_MAX_ENTRIES = envint("WAITLIST_MAX_ENTRIES", 10)
WAITLIST_MAX_COUNT = envint("WAITLIST_MAX_COUNT", 16)

# Calendar feeds (docs/feeds.md): how far back and ahead they reach, and fetches per URL per hour.
FEED_PAST_DAYS = envint("FEED_PAST_DAYS", 30)
FEED_FUTURE_DAYS = envint("FEED_FUTURE_DAYS", 90)
FEED_RATE_PER_HOUR = envint("FEED_RATE_PER_HOUR", 60)

# Logs go to stderr: plain lines, or with LOG_FORMAT=json one JSON object per line (time, level,
# logger, message, and the request or Celery task where there is one; kernel/logs.py).
_formatters = {
    "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    "json": {"()": "kernel.logs.JsonFormatter"},
}
LOG_FORMAT = envchoice("LOG_FORMAT", "plain", tuple(_formatters))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {LOG_FORMAT: _formatters[LOG_FORMAT]},
    # Secrets in request paths (calendar feed URLs) are redacted from every line, whichever logger
    # wrote it: Django's request logger, daphne's access log (portal/serve.py), Celery (kernel/logs.py).
    "filters": {"redact_secrets": {"()": "kernel.logs.RedactSecrets"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["redact_secrets"]}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    "loggers": {
        # Django's own handlers for these (a second console line under DEBUG, mail to ADMINS with the
        # request's URL, the dev server's console) would write past the filter: ours write instead.
        "django": {"handlers": [], "propagate": True},
        "django.server": {"handlers": ["console"], "propagate": False},
        # axes writes INFO lines at every login attempt; its warnings (each failure, each lockout) are the news.
        "axes": {"level": "WARNING"},
    },
}
