"""The one redactor (``sheetplane._redact``): what each holder's texts lose."""

from __future__ import annotations

import subprocess
import sys

from sheetplane._redact import REDACTED, Redactor


def test_a_database_urls_password_login_and_the_url_itself_are_redacted() -> None:
    url = "postgresql://sp_sess_abc:s3cr%21t@db.example:5432/app?sslmode=require"
    redact = Redactor(database_urls=[url])
    text = (
        f'connecting to {url} failed: password authentication failed for user "sp_sess_abc";'
        ' role "sp_sess_abc" does not exist; password=s3cr!t'
    )
    out = redact(text)
    assert url not in out
    assert "s3cr!t" not in out
    assert "sp_sess_abc" not in out
    assert out.count(REDACTED) == 4


def test_literal_secrets_go_longest_first_and_credentials_of_any_url_go_too() -> None:
    redact = Redactor(["tok", "tok-longer"])
    redact.add(["", "bypass"])
    out = redact("tok-longer tok bypass postgres://someone:hunter2@host/db password = 'x y'")
    assert out == (
        f"{REDACTED} {REDACTED} {REDACTED} postgres://someone:{REDACTED}@host/db "
        f"password = {REDACTED}"
    )


def test_a_url_that_does_not_parse_is_still_redacted_verbatim() -> None:
    url = "not a url but a secret"
    assert Redactor(database_urls=[url])(f"x {url} y") == f"x {REDACTED} y"


def test_importing_the_redactor_loads_no_database_driver() -> None:
    probe = "import sys, sheetplane._redact; print('psycopg' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
