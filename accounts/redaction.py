"""What of the accounts' secrets a log line may carry, taken out by kernel.logs' RedactSecrets (registered in
AccountsConfig.ready()).

- An OpenID Connect callback (``/oidc/callback/?code=…&state=…``): the code is exchanged for the person's
  tokens (PKCE makes a stolen one useless to most, but not to whoever also holds the session), and the state
  ties the login to the browser that began it. The web server's access line has both.
- A personal API token (``gpb_…``) is sent in a header, never in a URL; a script that puts one in a query
  string anyway must not leave it in the access log.

kernel.logs hands these every percent-encoded word decoded too, so ``%63ode=`` goes like ``code=``.
"""

from __future__ import annotations

import re

from accounts.services import TOKEN_PREFIX

# The OIDC callback's parameters, in any query string: the portal names no other parameter so.
_OIDC_PARAMETER = re.compile(r"([?&;](?:code|state|session_state)=)[^&;#\s\"'<>]+", re.IGNORECASE)
_API_TOKEN = re.compile(rf"({re.escape(TOKEN_PREFIX)})[A-Za-z0-9_-]{{8,}}")


def redact_login_secrets(text: str) -> str:
    if "=" in text:
        text = _OIDC_PARAMETER.sub(r"\1[redacted]", text)
    if TOKEN_PREFIX in text:
        text = _API_TOKEN.sub(r"\1[redacted]", text)
    return text
