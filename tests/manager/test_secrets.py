"""Manager secrets at rest (interop.md 7.7, 13): AES-256-GCM, HKDF-SHA256 key, base64 text.

interop.md gives no vector for 7.7, so this file pins one (also printed in docs/manager.md):
the key is checked against an HKDF written here from RFC 5869 with the standard library, and
the layout (nonce || ciphertext || tag, no associated data) by opening the stored value with
bare AES-GCM.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import SecretStr

from appliance import errors
from services.manager.secrets import HKDF_INFO, HKDF_SALT, SecretBox, SecretUnreadable, derive_key

MASTER_KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
OTHER_KEY = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
# The vector: this master key, nonce 000102030405060708090a0b, plaintext "node-secret-0123456789".
VECTOR_KEY = "09b5d4e0831dff3cfc43d5e6ce31f125ba2cbc56ad50b5e5fe2850ecbb932895"
VECTOR_NONCE = bytes(range(12))
VECTOR_PLAINTEXT = "node-secret-0123456789"
VECTOR_STORED = "AAECAwQFBgcICQoLh6ZKvCc3FbfXgvg7HsVYaQgZnC4wbvR80txnnpjBM3vvQJXP+go="


def rfc5869_sha256(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


@pytest.fixture
def box() -> SecretBox:
    return SecretBox(SecretStr(MASTER_KEY))


def test_the_salt_and_info_are_interop_7_7s() -> None:
    assert HKDF_SALT == b"mediaplane-manager-master-key-v1"
    assert HKDF_INFO == b"mediaplane-manager aes-256-gcm"


def test_the_key_is_hkdf_sha256_over_the_master_key_text() -> None:
    expected = rfc5869_sha256(MASTER_KEY.encode(), HKDF_SALT, HKDF_INFO, 32)
    assert derive_key(MASTER_KEY) == expected == bytes.fromhex(VECTOR_KEY)
    # The text, not the 32 bytes it spells: the two give different keys.
    assert derive_key(MASTER_KEY) != rfc5869_sha256(bytes.fromhex(MASTER_KEY), HKDF_SALT, HKDF_INFO, 32)


def test_the_vector(box: SecretBox) -> None:
    assert box.encrypt(VECTOR_PLAINTEXT, nonce=VECTOR_NONCE) == VECTOR_STORED
    assert box.decrypt(VECTOR_STORED) == VECTOR_PLAINTEXT


def test_the_layout_is_nonce_ciphertext_tag_with_empty_associated_data(box: SecretBox) -> None:
    blob = base64.b64decode(box.encrypt("pw", nonce=VECTOR_NONCE), validate=True)
    assert len(blob) == 12 + len("pw") + 16
    assert blob[:12] == VECTOR_NONCE
    aead = AESGCM(bytes.fromhex(VECTOR_KEY))
    assert aead.decrypt(blob[:12], blob[12:], b"") == b"pw"
    assert aead.decrypt(blob[:12], blob[12:], None) == b"pw"


@pytest.mark.parametrize("plaintext", ["", "sk-ant-api03-xyz", "ünïcødé ✓", "x" * 10_000])
def test_round_trip_with_a_fresh_nonce_each_time(box: SecretBox, plaintext: str) -> None:
    first, second = box.encrypt(plaintext), box.encrypt(plaintext)
    assert first != second  # a fresh random nonce per value
    assert box.decrypt(first) == box.decrypt(second) == plaintext
    assert SecretBox(SecretStr(MASTER_KEY)).decrypt(first) == plaintext  # same key from the same text


def test_a_wrong_master_key_is_a_clear_error(box: SecretBox) -> None:
    stored = box.encrypt("node-secret")
    with pytest.raises(SecretUnreadable) as caught:
        SecretBox(SecretStr(OTHER_KEY)).decrypt(stored)
    assert isinstance(caught.value, errors.Internal)  # a 500 kind, never the caller's fault
    assert "MEDIAPLANE_MASTER_KEY" in caught.value.message
    for secret in (stored, "node-secret", MASTER_KEY, OTHER_KEY):
        assert secret not in caught.value.message


def test_a_differently_cased_master_key_is_another_key(box: SecretBox) -> None:
    with pytest.raises(SecretUnreadable):
        SecretBox(SecretStr(MASTER_KEY.upper())).decrypt(box.encrypt("x"))


@pytest.mark.parametrize(
    ("stored", "words"),
    [
        ("not base64!", "not valid base64"),
        ("AAECAwQFBgcICQoL", "too short"),
        ("é", "not valid base64"),
        (VECTOR_STORED[:-4] + "AAA=", "cannot be decrypted"),
        ("B" + VECTOR_STORED[1:], "cannot be decrypted"),
    ],
)
def test_damaged_values_are_secret_unreadable(box: SecretBox, stored: str, words: str) -> None:
    with pytest.raises(SecretUnreadable) as caught:
        box.decrypt(stored)
    assert words in caught.value.message
    assert stored not in caught.value.message


def test_a_nonce_of_the_wrong_size_is_refused(box: SecretBox) -> None:
    with pytest.raises(ValueError):
        box.encrypt("x", nonce=b"\0" * 8)


def test_the_box_never_shows_its_key(box: SecretBox) -> None:
    assert MASTER_KEY not in repr(box) and VECTOR_KEY not in repr(box)
