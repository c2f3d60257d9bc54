"""Envelope encryption of scoped Postgres URLs as standard JWE (RFC 7516).

A scoped session's Postgres URL carries a password, so the gateway never
sends it in the clear. The caller makes a fresh RSA key pair, sends the public
half as a JWK, and the gateway answers a JWE in the flattened JSON
serialization (RFC 7516 §7.2.2):

* ``alg`` ``RSA-OAEP-256`` (RSAES-OAEP, SHA-256, MGF1 with SHA-256) wraps a
  fresh 256-bit content key, ``enc`` ``A256GCM`` encrypts the URL with it;
* the session's identity (org, play, namespace, logical table, operations,
  expiry; see :func:`session_aad`) travels as the JWE ``aad`` member, so the
  GCM additional data is ``ASCII(BASE64URL(protected) || '.' || BASE64URL(aad))``
  (RFC 7516 §5.1 step 14). An envelope replayed into another session's answer
  fails to authenticate.

Preloaded sessions (minted ahead of a run by a harness) use the same shape
with ``alg`` ``A256KW`` (RFC 3394 AES key wrap) under a 32-byte unwrap key.

The JOSE work (key wrapping, AES-GCM, the serialization) is joserfc's, a
maintained implementation of RFC 7515-7518. This module keeps only what is
sheetplane's own: the session identity as AAD, the checks on a caller's public
key (RSA, at least 2048 bits, an odd exponent >= 3, no private members), and a
strict reading of an envelope before joserfc sees it: exactly the members of
a flattened serialization, canonical unpadded base64url, only the header
parameters this use needs, and the one pair of algorithms each path allows.

Every decryption failure, whatever its cause (tampered protected header,
encrypted key, IV, ciphertext or tag; another AAD; another key; an
unexpected algorithm; a malformed envelope), raises
:class:`~sheetplane.errors.EnvelopeDecryptionError` with a message that names
no plaintext and no key material and carries no cause. A failed RSA unwrap is
not reported on its own: it reads "authentication failed", as a bad tag does
(RSA-OAEP is not open to the RSA1_5 oracle RFC 7516 §11.5 guards against, and
the message gives no step away).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from joserfc import jwe
from joserfc.errors import JoseError
from joserfc.jwk import OctKey, RSAKey

from .errors import EnvelopeDecryptionError, InvalidInputError

__all__ = [
    "ENVELOPE_REQUEST_ALG",
    "RSA_KEY_BITS",
    "UNWRAP_KEY_BYTES",
    "DecryptionKey",
    "check_public_jwk",
    "check_unwrap_key",
    "decrypt_postgres_url",
    "decrypt_with_unwrap_key",
    "encrypt_postgres_url",
    "encrypt_with_unwrap_key",
    "generate_decryption_key",
    "optional_unwrap_key",
    "session_aad",
]

#: The ``postgresUrlEncryption.alg`` a caller sends with ``create_db_session``.
ENVELOPE_REQUEST_ALG: Final = "RSA-OAEP-256+A256GCM"

#: Modulus size of the keys this module generates; smaller public keys are refused.
RSA_KEY_BITS: Final = 2048

#: The largest public modulus accepted: OpenSSL's ``OPENSSL_RSA_MAX_MODULUS_BITS``,
#: past which it refuses to encrypt at all.
RSA_MAX_KEY_BITS: Final = 16384

#: Members of an RSA private JWK (RFC 7518 §6.3.2); a public key carries none.
_PRIVATE_MEMBERS: Final = ("d", "p", "q", "dp", "dq", "qi", "oth")

#: Small primes a real RSA modulus (a product of two large primes) never divides.
_SMALL_PRIMES: Final = tuple(
    p for p in range(3, 1000) if all(p % q for q in range(2, int(p**0.5) + 1))
)

_RSA_ALG: Final = "RSA-OAEP-256"
_KW_ALG: Final = "A256KW"
_ENC: Final = "A256GCM"
_IV_BYTES: Final = 12
_TAG_BYTES: Final = 16
_PUBLIC_EXPONENT: Final = 65537
#: The size of a harness unwrap key (an AES-256 key-wrapping key).
UNWRAP_KEY_BYTES: Final = 32
#: Header parameters this implementation understands; any other one in an
#: envelope (``zip``, ``crit``, ``epk``...) makes it refuse the envelope.
_KNOWN_HEADER_PARAMS: Final = frozenset({"alg", "enc", "kid", "typ", "cty"})
_ENVELOPE_MEMBERS: Final = frozenset(
    {"alg", "protected", "unprotected", "header", "encrypted_key", "iv", "ciphertext", "tag", "aad"}
)
#: The envelope's own ``alg`` member when the URL is sealed to a public key: what
#: the seed's runtime branches on (``encryptedPostgresUrl.alg``) to unwrap it with
#: the private key it kept, rather than with a harness unwrap key.
PUBLIC_KEY_ENVELOPE_ALG: Final = "RSA-OAEP-256+A256GCM"


# --- base64url ---------------------------------------------------------------


def _b64u_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64u_decode(text: str) -> bytes:
    """Strict unpadded base64url (RFC 7515 §2): any other alphabet or padding is refused."""
    if not isinstance(text, str) or "=" in text or len(text) % 4 == 1:
        raise ValueError("not base64url")
    try:
        raw = text.encode("ascii")
        decoded = base64.b64decode(raw + b"=" * (-len(raw) % 4), altchars=b"-_", validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise ValueError("not base64url") from None
    if _b64u_encode(decoded) != text:
        # Non-canonical trailing bits: two strings would name the same bytes.
        raise ValueError("not canonical base64url")
    return decoded


# --- keys ------------------------------------------------------------------------


@attrs.define(eq=False, repr=False)
class DecryptionKey:
    """An RSA private key that opens envelopes addressed to its public half.

    Its ``repr`` names the key's size and nothing of the key itself.
    """

    _private_key: rsa.RSAPrivateKey

    def __repr__(self) -> str:
        return f"<DecryptionKey RSA-{self._private_key.key_size}>"

    @property
    def private_key(self) -> rsa.RSAPrivateKey:
        """The private key (for tests and interoperability checks)."""
        return self._private_key

    def public_jwk(self) -> dict[str, str]:
        """The public half as a JWK (RFC 7517): ``kty``, ``n``, ``e``, ``alg``, ``use``."""
        public = RSAKey.import_key(self._private_key.public_key()).as_dict(private=False)
        return {
            "kty": "RSA",
            "n": str(public["n"]),
            "e": str(public["e"]),
            "alg": _RSA_ALG,
            "use": "enc",
        }

    def encryption_request(self) -> dict[str, Any]:
        """The ``postgresUrlEncryption`` member of a ``create_db_session`` request."""
        return {"alg": ENVELOPE_REQUEST_ALG, "publicKeyJwk": self.public_jwk()}


def generate_decryption_key() -> DecryptionKey:
    """A fresh RSA-2048 key pair with public exponent 65537.

    Generation takes tens of milliseconds of CPU; callers on trio that make
    many keys should run it in a worker thread.
    """
    key = rsa.generate_private_key(public_exponent=_PUBLIC_EXPONENT, key_size=RSA_KEY_BITS)
    return DecryptionKey(key)


def check_public_jwk(jwk: object) -> None:
    """Refuse (``InvalidInputError``) a public JWK :func:`encrypt_postgres_url` would refuse."""
    _public_key_from_jwk(jwk)


def _public_key_from_jwk(jwk: object) -> rsa.RSAPublicKey:
    """Parse and check an RSA public JWK; raise ``InvalidInputError`` naming what is wrong."""
    if not isinstance(jwk, Mapping):
        raise InvalidInputError(f"public key JWK must be an object, got {type(jwk).__name__}")
    if jwk.get("kty") != "RSA":
        raise InvalidInputError(f"public key JWK kty must be 'RSA', got {jwk.get('kty')!r}")
    if "alg" in jwk and jwk["alg"] != _RSA_ALG:
        raise InvalidInputError(f"public key JWK alg must be {_RSA_ALG!r}, got {jwk['alg']!r}")
    if "use" in jwk and jwk["use"] != "enc":
        raise InvalidInputError(f"public key JWK use must be 'enc', got {jwk['use']!r}")
    key_ops = jwk.get("key_ops")
    if key_ops is not None and (
        not isinstance(key_ops, list) or not {"wrapKey", "encrypt"} & set(map(str, key_ops))
    ):
        raise InvalidInputError("public key JWK key_ops must allow 'wrapKey' or 'encrypt'")
    if any(member in jwk for member in _PRIVATE_MEMBERS):
        # Refuse a private key (or any of its factors) sent where a public one
        # belongs: it is a leak.
        raise InvalidInputError("public key JWK must not carry private key members")
    n_text, e_text = jwk.get("n"), jwk.get("e")
    try:
        if not isinstance(n_text, str) or not isinstance(e_text, str):
            raise ValueError("n and e must be strings")
        n = int.from_bytes(_b64u_decode(n_text), "big")
        e = int.from_bytes(_b64u_decode(e_text), "big")
    except ValueError:
        raise InvalidInputError("public key JWK n and e must be base64url integers") from None
    if n.bit_length() < RSA_KEY_BITS:
        raise InvalidInputError(
            f"public key must be at least {RSA_KEY_BITS} bits, got {n.bit_length()}"
        )
    if n.bit_length() > RSA_MAX_KEY_BITS:
        raise InvalidInputError(
            f"public key must be at most {RSA_MAX_KEY_BITS} bits, got {n.bit_length()}"
        )
    if e < 3 or e % 2 == 0 or e >= n:
        raise InvalidInputError(f"public key exponent must be odd, >= 3 and below n, got {e}")
    if n % 2 == 0 or any(n % p == 0 for p in _SMALL_PRIMES):
        raise InvalidInputError("public key JWK n is not an RSA modulus (it has a small factor)")
    try:
        key = rsa.RSAPublicNumbers(e, n).public_key()
        # What OpenSSL would refuse at sealing time is refused here, before a
        # session exists for the key.
        key.encrypt(b"", padding.OAEP(padding.MGF1(hashes.SHA256()), hashes.SHA256(), None))
    except ValueError:
        raise InvalidInputError("public key JWK is not a valid RSA public key") from None
    return key


# --- the session's identity --------------------------------------------------------------


def session_aad(
    *,
    org_id: str,
    play_name: str,
    table_namespace: str,
    logical_table: str,
    operations: Iterable[str],
    expires_at: str,
) -> bytes:
    """The additional authenticated data that binds an envelope to one session.

    Canonical JSON (sorted keys, compact separators, UTF-8) of the session's
    identity, with ``operations`` sorted so their order does not matter.
    ``expires_at`` is the exact ``expiresAt`` string of the gateway's answer.
    """
    identity = {
        "expiresAt": expires_at,
        "logicalTable": logical_table,
        "operations": sorted(operations),
        "orgId": org_id,
        "playName": play_name,
        "tableNamespace": table_namespace,
    }
    for name, value in identity.items():
        if name != "operations" and not isinstance(value, str):
            raise InvalidInputError(f"session identity {name} must be a string, got {value!r}")
    return json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


# --- JWE ---------------------------------------------------------------------------------


def _seal(url: str, alg: str, key: RSAKey | OctKey, aad: bytes) -> dict[str, str]:
    if not isinstance(url, str):
        raise InvalidInputError(f"the URL to encrypt must be a string, got {type(url).__name__}")
    if not isinstance(aad, bytes | bytearray) or not aad:
        raise InvalidInputError("aad must be non-empty bytes (a session identity)")
    protected = {"alg": alg, "enc": _ENC}
    message = jwe.FlattenedJSONEncryption(protected, url.encode("utf-8"), aad=bytes(aad))
    message.add_recipient({}, key)
    sealed = jwe.encrypt_json(message, None, algorithms=[alg, _ENC])
    # joserfc writes an empty per-recipient header; the envelope is the six members.
    return {name: str(sealed[name]) for name in _SEALED_MEMBERS}


_SEALED_MEMBERS: Final = ("protected", "encrypted_key", "iv", "ciphertext", "tag", "aad")


def _fail(reason: str) -> EnvelopeDecryptionError:
    return EnvelopeDecryptionError(f"encrypted Postgres URL did not open: {reason}")


def _check(envelope: Mapping[str, Any], alg: str, aad: bytes) -> dict[str, Any]:
    """Read an envelope strictly; raise ``EnvelopeDecryptionError`` if it is off.

    What joserfc would accept more loosely (padding, extra members, extra or
    moved header parameters, other algorithms) is refused here, before any
    key is used.
    """
    if not isinstance(envelope, Mapping):
        raise _fail("the envelope is not an object")
    if not isinstance(aad, bytes | bytearray):
        raise _fail("the expected aad is not bytes")
    unknown = set(envelope) - _ENVELOPE_MEMBERS
    if unknown or "recipients" in envelope:
        raise _fail("the envelope is not a flattened JWE JSON serialization")
    if "alg" in envelope and envelope["alg"] != f"{alg}+{_ENC}":
        raise _fail(f"the envelope's alg member must be {alg}+{_ENC}")
    members: dict[str, bytes] = {}
    for name in _SEALED_MEMBERS:
        value = envelope.get(name)
        if not isinstance(value, str):
            raise _fail(f"the envelope's {name} member is missing")
        try:
            members[name] = _b64u_decode(value)
        except ValueError:
            raise _fail(f"the envelope's {name} member is not base64url") from None
    if envelope["aad"] != _b64u_encode(bytes(aad)):
        raise _fail("the envelope belongs to another session")
    try:
        header = json.loads(members["protected"].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _fail("the protected header is not JSON") from None
    if not isinstance(header, dict):
        raise _fail("the protected header is not an object")
    for name in ("unprotected", "header"):
        extra = envelope.get(name)
        if extra is None:
            continue
        if not isinstance(extra, Mapping) or set(extra) & (set(header) | {"alg", "enc"}):
            raise _fail(f"the envelope's {name} member repeats or moves a protected parameter")
        header = {**header, **extra}
    if set(header) - _KNOWN_HEADER_PARAMS:
        raise _fail("the header carries parameters this implementation does not support")
    if header.get("alg") != alg or header.get("enc") != _ENC:
        raise _fail(f"the envelope must use alg {alg} with enc {_ENC}")
    if len(members["iv"]) != _IV_BYTES or len(members["tag"]) != _TAG_BYTES:
        raise _fail("the IV or tag has the wrong length")
    # The JWE itself, without the member that names it for the seed's runtime.
    return {name: value for name, value in envelope.items() if name != "alg"}


def _open(envelope: dict[str, Any], key: RSAKey | OctKey, alg: str) -> str:
    try:
        opened = jwe.decrypt_json(envelope, key, algorithms=[alg, _ENC])  # type: ignore[arg-type]
    except (JoseError, ValueError, TypeError):
        # The cause is dropped: a library error may carry key or plaintext bytes along.
        raise _fail("authentication failed (tampered, another session, or another key)") from None
    try:
        return opened.plaintext.decode("utf-8")  # type: ignore[union-attr]
    except (AttributeError, UnicodeDecodeError):
        raise _fail("the plaintext is not UTF-8") from None


def encrypt_postgres_url(url: str, public_jwk: Mapping[str, Any], aad: bytes) -> dict[str, str]:
    """Encrypt ``url`` to the holder of ``public_jwk``, bound to ``aad``.

    Returns a flattened JWE JSON serialization with members ``protected``,
    ``encrypted_key``, ``iv``, ``ciphertext``, ``tag`` and ``aad``, and beside
    them ``alg`` = ``PUBLIC_KEY_ENVELOPE_ALG`` (as the seed's sessions carry it).
    A public key that is not RSA of at least 2048 bits raises ``InvalidInputError``.
    """
    public_key = _public_key_from_jwk(public_jwk)
    sealed = _seal(url, _RSA_ALG, RSAKey.import_key(public_key), aad)
    return {"alg": PUBLIC_KEY_ENVELOPE_ALG, **sealed}


def decrypt_postgres_url(envelope: Mapping[str, Any], key: DecryptionKey, aad: bytes) -> str:
    """Open an envelope made by :func:`encrypt_postgres_url` for ``key``'s public half.

    ``aad`` is the identity of the session the answer describes; an envelope
    made for any other identity fails. Every failure raises
    ``EnvelopeDecryptionError``.
    """
    if not isinstance(key, DecryptionKey):
        raise InvalidInputError(f"key must be a DecryptionKey, got {type(key).__name__}")
    checked = _check(envelope, _RSA_ALG, aad)
    return _open(checked, RSAKey.import_key(key.private_key), _RSA_ALG)


def check_unwrap_key(unwrap_key: object, what: str = "the unwrap key") -> bytes:
    """``unwrap_key`` as bytes; ``InvalidInputError`` unless it is ``UNWRAP_KEY_BYTES`` long."""
    if not isinstance(unwrap_key, bytes | bytearray) or len(unwrap_key) != UNWRAP_KEY_BYTES:
        raise InvalidInputError(f"{what} must be {UNWRAP_KEY_BYTES} bytes")
    return bytes(unwrap_key)


def optional_unwrap_key(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: ``value`` is None or a ``UNWRAP_KEY_BYTES``-byte ``bytes`` key."""
    if value is not None:
        if not isinstance(value, bytes):
            raise InvalidInputError(f"{attribute.name} must be {UNWRAP_KEY_BYTES} bytes or None")
        check_unwrap_key(value, attribute.name)


def encrypt_with_unwrap_key(url: str, unwrap_key: bytes, aad: bytes) -> dict[str, str]:
    """Encrypt ``url`` under a 32-byte harness unwrap key (JWE ``A256KW`` + ``A256GCM``)."""
    kek = check_unwrap_key(unwrap_key)
    return _seal(url, _KW_ALG, OctKey.import_key(kek), aad)


def decrypt_with_unwrap_key(envelope: Mapping[str, Any], unwrap_key: bytes, aad: bytes) -> str:
    """Open an envelope made by :func:`encrypt_with_unwrap_key`; failures raise
    ``EnvelopeDecryptionError``."""
    try:
        kek = check_unwrap_key(unwrap_key)
    except InvalidInputError:
        raise _fail(f"the unwrap key must be {UNWRAP_KEY_BYTES} bytes") from None
    checked = _check(envelope, _KW_ALG, aad)
    return _open(checked, OctKey.import_key(kek), _KW_ALG)
