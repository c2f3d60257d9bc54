"""The embedded server: password authentication over TCP, VALID UNTIL, cleanup."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sheetplane.store.embedded import DATABASE_URL_ENV, EmbeddedPostgres, database_url_from_env


def test_server_starts_requires_its_password_and_is_removed_on_stop() -> None:
    server = EmbeddedPostgres()
    with pytest.raises(RuntimeError):
        _ = server.url
    with server:
        url = server.url
        params = conninfo_to_dict(url)
        assert params["host"] == "127.0.0.1"
        assert int(params["port"]) == server.port
        password = str(params["password"])
        assert len(password) >= 24
        assert password not in repr(server)
        with psycopg.connect(url, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int, current_setting('fsync'),"
                " current_setting('unix_socket_directories'), current_user"
            ).fetchone()
        assert row == (200, "on", "", "postgres")
        wrong = make_conninfo(url, password="not-the-password")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(wrong, connect_timeout=5)
        data_root = server._data_root
        assert data_root is not None and data_root.exists()
    assert not server.running
    assert not data_root.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)
    server.stop()  # a second stop is harmless


def test_expired_role_cannot_connect(database_url: str) -> None:
    """Password auth, not trust: a role past its VALID UNTIL is refused."""
    role = f"sp_expired_{uuid.uuid4().hex[:12]}"
    fresh = f"sp_fresh_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(
            f"CREATE ROLE {role} LOGIN PASSWORD 'pw-expired' VALID UNTIL '2000-01-01T00:00:00Z'"
        )
        admin.execute(f"CREATE ROLE {fresh} LOGIN PASSWORD 'pw-fresh' VALID UNTIL 'infinity'")
    try:
        expired_url = make_conninfo(database_url, user=role, password="pw-expired")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(expired_url, connect_timeout=5)
        fresh_url = make_conninfo(database_url, user=fresh, password="pw-fresh")
        with psycopg.connect(fresh_url, connect_timeout=5) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (fresh,)
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}")
            admin.execute(f"DROP ROLE {fresh}")


def test_database_url_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    assert database_url_from_env() is None
    monkeypatch.setenv(DATABASE_URL_ENV, "  ")
    assert database_url_from_env() is None
    monkeypatch.setenv(DATABASE_URL_ENV, "postgresql://u:p@h/db")
    assert database_url_from_env() == "postgresql://u:p@h/db"
