"""Manager secrets at rest (interop.md 7.7): one value in, one text column out.

Each secret (node secrets and a pending rotation, AI keys, tunnel keys, bind secrets, PSKs) is
stored as standard base64 (padded) of ``nonce(12) || ciphertext || tag(16)``: AES-256-GCM
with a fresh random nonce per value and empty associated data (interop.md 13). The key is
HKDF-SHA256, 32 bytes, over the ``MEDIAPLANE_MASTER_KEY`` *text* as UTF-8, with the salt and
info below. A database copied without the master key is useless; a changed master key makes
every stored secret unreadable (:class:`SecretUnreadable`), never silently wrong.

Registration tokens are not encrypted but hashed (SHA-256 hex, interop.md 7.7): that is the
store's business, not this module's.

This is a different format from the edge's ``secrets.json`` (``appliance/config/secrets.py``:
a ``v1:`` file prefix, a machine-id key), so it shares only the ``cryptography`` primitives.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

from appliance import errors

__all__ = ["HKDF_INFO", "HKDF_SALT", "SecretBox", "SecretUnreadable", "derive_key"]

HKDF_SALT: Final = b"mediaplane-manager-master-key-v1"  # interop.md 7.7
HKDF_INFO: Final = b"mediaplane-manager aes-256-gcm"  # interop.md 7.7
_NONCE_BYTES: Final = 12
_TAG_BYTES: Final = 16


class SecretUnreadable(errors.Internal):
    """A stored secret cannot be decrypted (HTTP 500): another master key, or damaged data.

    The message never holds the stored text, the plaintext or the key.
    """


def derive_key(master_key: str) -> bytes:
    """The AES-256-GCM key: HKDF-SHA256 over the master key's UTF-8 text (interop.md 7.7)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=HKDF_SALT, info=HKDF_INFO).derive(master_key.encode())


class SecretBox:
    """Encrypts and decrypts single secrets with the key derived from ``MEDIAPLANE_MASTER_KEY``.

    Pure computation: safe to call from any thread; the store calls it in its worker thread.
    """

    __slots__ = ("_aead",)

    def __init__(self, master_key: SecretStr) -> None:
        self._aead = AESGCM(derive_key(master_key.get_secret_value()))

    def __repr__(self) -> str:
        return "SecretBox(<key>)"

    def encrypt(self, plaintext: str, *, nonce: bytes | None = None) -> str:
        """The stored form of ``plaintext``: base64 of nonce || ciphertext || tag.

        ``nonce`` is for test vectors only: left out, 12 fresh random bytes are drawn, as a
        GCM nonce must never repeat under one key.
        """
        if nonce is None:
            nonce = os.urandom(_NONCE_BYTES)
        elif len(nonce) != _NONCE_BYTES:
            raise ValueError("the nonce must be 12 bytes")
        sealed = self._aead.encrypt(nonce, plaintext.encode("utf-8"), None)  # interop.md 13: no AAD
        return base64.b64encode(nonce + sealed).decode("ascii")

    def decrypt(self, stored: str) -> str:
        """The plaintext of a value :meth:`encrypt` made. Raises SecretUnreadable."""
        try:
            blob = base64.b64decode(stored, validate=True)
        except (binascii.Error, ValueError):  # ValueError: a non-ASCII str
            raise SecretUnreadable("a stored secret is not valid base64 (damaged data)") from None
        if len(blob) < _NONCE_BYTES + _TAG_BYTES:
            raise SecretUnreadable("a stored secret is too short to be AES-GCM (damaged data)")
        try:
            plaintext = self._aead.decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], None)
        except InvalidTag:
            raise SecretUnreadable(
                "a stored secret cannot be decrypted: MEDIAPLANE_MASTER_KEY is not the key it was "
                "stored with, or the data is damaged"
            ) from None
        try:
            return plaintext.decode("utf-8")
        except UnicodeDecodeError:
            raise SecretUnreadable("a stored secret is not UTF-8 text") from None
