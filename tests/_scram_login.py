"""A Postgres login that can stop before its SCRAM client-final message.

Tests need a login held at a known point of its authentication: the server
has read the role's verifier (the role existed when the login began) but has
not yet looked the role up to start the session. This client speaks just
enough of the frontend/backend protocol, on its documented messages, to get
there and go on when told: StartupMessage, AuthenticationSASL,
SASLInitialResponse, AuthenticationSASLContinue, SASLResponse (SCRAM-SHA-256,
RFC 5802 and RFC 7677, without channel binding), then the simple Query
protocol to use the session.

    login = await PausedLogin.begin(host, port, role, password, dbname)
    ...                                   # the login waits before client-final
    error = await login.finish()          # None: logged in; else the server's message
    await login.query("SELECT 1")         # None, or the error's message
    await login.aclose()
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import secrets
import struct

import attrs
import trio

PROTOCOL_3_0 = 196608
AUTH_OK, AUTH_SASL, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL = 0, 10, 11, 12
MECHANISM = b"SCRAM-SHA-256"


class LoginProtocolError(Exception):
    """The server answered something this small client does not expect."""


def error_message(body: bytes) -> str:
    """The ``M`` (message) field of an ErrorResponse body."""
    for field in body.split(b"\0"):
        if field[:1] == b"M":
            return field[1:].decode("utf-8", "replace")
    return body.decode("utf-8", "replace")


@attrs.define(eq=False)
class PausedLogin:
    """A connection whose SCRAM login stopped before the client-final message."""

    stream: trio.SocketStream
    password: str = attrs.field(repr=False)
    client_first_bare: bytes
    server_first: bytes
    buffer: bytearray = attrs.field(factory=bytearray)

    @classmethod
    async def begin(
        cls, host: str, port: int, user: str, password: str, dbname: str
    ) -> PausedLogin:
        """Open the connection and run the login up to AuthenticationSASLContinue."""
        stream = await trio.open_tcp_stream(host, port)
        params = b"".join(
            key + b"\0" + value.encode() + b"\0"
            for key, value in ((b"user", user), (b"database", dbname))
        )
        body = struct.pack("!i", PROTOCOL_3_0) + params + b"\0"
        await stream.send_all(struct.pack("!i", len(body) + 4) + body)
        login = cls(stream, password, b"", b"")
        kind, payload = await login.auth_message()
        if kind != AUTH_SASL or MECHANISM not in payload.split(b"\0"):
            raise LoginProtocolError(f"expected AuthenticationSASL, got {kind}")
        nonce = base64.b64encode(secrets.token_bytes(18))
        login.client_first_bare = b"n=,r=" + nonce
        first = b"n,," + login.client_first_bare
        initial = MECHANISM + b"\0" + struct.pack("!i", len(first)) + first
        await login.send(b"p", initial)
        kind, login.server_first = await login.auth_message()
        if kind != AUTH_SASL_CONTINUE:
            raise LoginProtocolError(f"expected AuthenticationSASLContinue, got {kind}")
        return login

    async def finish(self) -> str | None:
        """Send the client-final message; None once the session is ready, else the
        server's error message (the connection is then closed)."""
        fields = dict(part.split(b"=", 1) for part in self.server_first.split(b","))
        salted = hashlib.pbkdf2_hmac(
            "sha256", self.password.encode(), base64.b64decode(fields[b"s"]), int(fields[b"i"])
        )
        client_key = hmac.new(salted, b"Client Key", "sha256").digest()
        without_proof = b"c=biws,r=" + fields[b"r"]
        auth_message = b",".join((self.client_first_bare, self.server_first, without_proof))
        signature = hmac.new(hashlib.sha256(client_key).digest(), auth_message, "sha256").digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        await self.send(b"p", without_proof + b",p=" + base64.b64encode(proof))
        return await self.until_ready()

    async def query(self, statement: str) -> str | None:
        """Run ``statement`` (simple Query); None, or the error's message (also when
        the server closed the connection)."""
        try:
            await self.send(b"Q", statement.encode() + b"\0")
            return await self.until_ready()
        except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError) as exc:
            return f"connection closed: {type(exc).__name__}"

    async def aclose(self) -> None:
        """Send Terminate (if the connection is still open) and close."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.send(b"X", b"")
        await self.stream.aclose()

    async def send(self, kind: bytes, body: bytes) -> None:
        await self.stream.send_all(kind + struct.pack("!i", len(body) + 4) + body)

    async def receive(self) -> tuple[bytes, bytes]:
        """One backend message: (type byte, body)."""
        while True:
            if len(self.buffer) >= 5:
                (length,) = struct.unpack("!i", self.buffer[1:5])
                if len(self.buffer) >= 1 + length:
                    kind, body = bytes(self.buffer[:1]), bytes(self.buffer[5 : 1 + length])
                    del self.buffer[: 1 + length]
                    return kind, body
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise EOFError("the server closed the connection")
            self.buffer += chunk

    async def auth_message(self) -> tuple[int, bytes]:
        kind, body = await self.receive()
        if kind == b"E":
            raise LoginProtocolError(error_message(body))
        if kind != b"R":
            raise LoginProtocolError(f"expected an authentication message, got {kind!r}")
        return struct.unpack("!i", body[:4])[0], body[4:]

    async def until_ready(self) -> str | None:
        """Read up to ReadyForQuery; the first ErrorResponse's message, if any."""
        error: str | None = None
        while True:
            try:
                kind, body = await self.receive()
            except (EOFError, trio.BrokenResourceError) as exc:
                return error or f"connection closed: {type(exc).__name__}"
            if kind == b"E" and error is None:
                error = error_message(body)
            elif kind == b"Z":
                return error
