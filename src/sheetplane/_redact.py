"""The one redactor: secrets taken out of a text before it reaches an error or a log line.

Whoever holds secrets holds a :class:`Redactor` in its own state: a pool (its
database URL), the gateway client (its token and bypass token), a gateway's
logs (its database URL and tokens). Each removes its own secrets, the login
name the server quotes (``for user "..."``, ``role "..."``: a scoped session's
role name is half its credentials), and any URL-shaped or ``password=``
credentials, whoever's they are. Importing this module loads no database
driver: only :meth:`Redactor.add_database_url` reads a URL, with psycopg's
parser.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from typing import Final

__all__ = ["REDACTED", "Redactor"]

#: What a secret is replaced with.
REDACTED: Final = "[redacted]"

_URL_CREDENTIALS: Final = re.compile(r"(?i)(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@")
_KEYWORD_PASSWORD: Final = re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


class Redactor:
    """Removes its secrets, and any credentials a URL or a ``password=`` carries, from text."""

    __slots__ = ("_logins", "_secrets")

    def __init__(self, secrets: Iterable[str] = (), *, database_urls: Iterable[str] = ()) -> None:
        self._secrets: list[str] = []
        self._logins: list[re.Pattern[str]] = []
        self.add(secrets)
        for url in database_urls:
            self.add_database_url(url)

    def add(self, secrets: Iterable[str]) -> None:
        """Redact each of ``secrets`` (empty ones are ignored) from now on."""
        known = set(self._secrets)
        known.update(secret for secret in secrets if secret)
        # Longest first, so a secret that contains another goes whole.
        self._secrets = sorted(known, key=len, reverse=True)

    def add_database_url(self, url: str) -> None:
        """Redact ``url`` itself, its passwords, and its login name where the server
        quotes it. A URL that does not parse is still redacted verbatim."""
        from psycopg.conninfo import conninfo_to_dict

        secrets = [url]
        with contextlib.suppress(Exception):
            params = conninfo_to_dict(url)
            secrets += [str(params.get(name) or "") for name in ("password", "sslpassword")]
            user = params.get("user")
            if user:
                login = re.compile(rf'(?i)((?:for user|role) )"{re.escape(str(user))}"')
                if login.pattern not in {known.pattern for known in self._logins}:
                    self._logins.append(login)
        self.add(secrets)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        for login in self._logins:
            text = login.sub(rf'\1"{REDACTED}"', text)
        text = _URL_CREDENTIALS.sub(rf"\1{REDACTED}@", text)
        return _KEYWORD_PASSWORD.sub(rf"\1{REDACTED}", text)
