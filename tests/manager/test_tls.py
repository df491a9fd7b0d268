"""The manager's certificate in direct mode (interop.md 1.3, 7.4): generation, reuse, refusals."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from appliance import errors
from services.manager.settings import StartupError
from services.manager.tls import (
    SELF_SIGNED_VALIDITY,
    check_pair,
    ensure_certificate,
    generate_self_signed,
    is_self_signed,
)
from tests.manager.certs import NOW, build, ca_signed_pair, cert_pem, key_pem

LONG = "a" * 40 + "." + "b" * 40
ADDRESSES = [ipaddress.ip_address(a) for a in ("127.0.0.1", "192.0.2.2", "::1", "fd00::2")]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def sans_of(certificate: x509.Certificate) -> x509.SubjectAlternativeName:
    return certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def ensure(tls_dir: Path, now: dt.datetime = NOW, hostname: str = "mgr-1"):  # type: ignore[no-untyped-def]
    return ensure_certificate(tls_dir, hostname=hostname, addresses=ADDRESSES, now=now)


# --------------------------------------------------------------------------- generation


def test_the_generated_certificate() -> None:
    cert, key = generate_self_signed("mgr-1", ADDRESSES, NOW)
    certificate = check_pair(cert, key)
    assert certificate.subject == certificate.issuer
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "mgr-1"
    sans = sans_of(certificate)
    assert sans.get_values_for_type(x509.DNSName) == ["mgr-1", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == ADDRESSES
    assert certificate.not_valid_before_utc == NOW - dt.timedelta(hours=1)
    assert certificate.not_valid_after_utc == NOW + SELF_SIGNED_VALIDITY
    assert SELF_SIGNED_VALIDITY <= dt.timedelta(days=825)
    assert certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert isinstance(certificate.public_key(), ec.EllipticCurvePublicKey)
    assert is_self_signed(certificate)


def test_two_generations_are_two_keys() -> None:
    first, second = generate_self_signed("h", [], NOW), generate_self_signed("h", [], NOW)
    assert first[1] != second[1]
    assert (
        x509.load_pem_x509_certificate(first[0]).serial_number
        != x509.load_pem_x509_certificate(second[0]).serial_number
    )


@pytest.mark.parametrize(
    ("hostname", "cn", "dns"),
    [
        ("localhost", "localhost", ["localhost"]),
        ("MGR-1.Example.", "mgr-1.example", ["mgr-1.example", "localhost"]),
        ("régie", "xn--rgie-bpa", ["xn--rgie-bpa", "localhost"]),
        ("", "localhost", ["localhost"]),
        # CN is capped at 64 characters (RFC 5280 ub-common-name); the SAN keeps the whole name.
        (LONG, LONG[:64], [LONG, "localhost"]),
        ("a" * 64, "localhost", ["localhost"]),  # a 64-character label is no DNS name
    ],
)
def test_hostnames(hostname: str, cn: str, dns: list[str]) -> None:
    certificate = x509.load_pem_x509_certificate(generate_self_signed(hostname, [], NOW)[0])
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == cn
    assert sans_of(certificate).get_values_for_type(x509.DNSName) == dns


def test_duplicate_addresses_are_listed_once() -> None:
    certificate = x509.load_pem_x509_certificate(generate_self_signed("h", ADDRESSES + ADDRESSES[:2], NOW)[0])
    assert sans_of(certificate).get_values_for_type(x509.IPAddress) == ADDRESSES


# --------------------------------------------------------------------------- self-signed or not


def test_is_self_signed_needs_the_signature_to_verify_with_its_own_key() -> None:
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    assert is_self_signed(build("a", "a", key.public_key(), key))
    # issuer == subject, but signed by another key: not self-signed
    assert not is_self_signed(build("a", "a", key.public_key(), other))
    # a CA-signed leaf
    _, leaf_pem, _ = ca_signed_pair(hostname="m.test", ip="127.0.0.1")
    assert not is_self_signed(x509.load_pem_x509_certificate(leaf_pem))


# --------------------------------------------------------------------------- the pair check (also 7.4 upload)


def test_check_pair_refusals() -> None:
    cert, key = generate_self_signed("h", [], NOW)
    _, other_key = generate_self_signed("h", [], NOW)
    cases = [
        (b"not a pem", key, "the certificate is not a PEM X.509 certificate"),
        (cert, b"not a pem", "the key is not an unencrypted PEM private key"),
        (cert, other_key, "the key does not match the certificate"),
        (key, key, "the certificate is not a PEM X.509 certificate"),
    ]
    for cert_pem_, key_pem_, message in cases:
        with pytest.raises(errors.InvalidInput) as caught:
            check_pair(cert_pem_, key_pem_)
        assert caught.value.message == message


def test_check_pair_takes_the_leaf_of_a_chain() -> None:
    ca_pem, leaf_pem, leaf_key = ca_signed_pair(hostname="m.test", ip="127.0.0.1")
    leaf = check_pair(leaf_pem + ca_pem, leaf_key)
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "m.test"


# --------------------------------------------------------------------------- ensure_certificate


def test_a_missing_pair_is_generated_private(tmp_path: Path) -> None:
    tls_dir = tmp_path / "data" / "tls"
    served = ensure(tls_dir)
    assert served.generated and served.self_signed
    assert (served.cert_path, served.key_path) == (tls_dir / "cert.pem", tls_dir / "key.pem")
    assert mode(tls_dir) == 0o700
    assert mode(served.key_path) == 0o600
    assert check_pair(served.cert_path.read_bytes(), served.key_path.read_bytes()) == served.certificate
    assert sorted(p.name for p in tls_dir.iterdir()) == ["cert.pem", "key.pem"]  # no temp files left


def test_an_existing_pair_is_reused(tmp_path: Path) -> None:
    first = ensure(tmp_path)
    cert, key = first.cert_path.read_bytes(), first.key_path.read_bytes()
    second = ensure(tmp_path, now=NOW + dt.timedelta(days=100), hostname="renamed")
    assert not second.generated and second.self_signed
    assert (second.cert_path.read_bytes(), second.key_path.read_bytes()) == (cert, key)


def test_an_orphan_key_is_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "key.pem").write_bytes(b"left by an interrupted first start")
    with caplog.at_level(logging.WARNING):
        served = ensure(tmp_path)
    assert served.generated
    assert check_pair(served.cert_path.read_bytes(), served.key_path.read_bytes())
    assert "replacing both" in caplog.text


def test_a_cert_without_its_key_is_exit_2_and_untouched(tmp_path: Path) -> None:
    served = ensure(tmp_path)
    cert = served.cert_path.read_bytes()
    served.key_path.unlink()
    with pytest.raises(StartupError) as caught:
        ensure(tmp_path)
    assert caught.value.exit_code == 2
    assert str(served.key_path) in caught.value.message
    assert served.cert_path.read_bytes() == cert
    assert not served.key_path.exists()


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("cert", "the certificate is not a PEM X.509 certificate"),
        ("key", "the key is not an unencrypted PEM private key"),
        ("swap", "the key does not match the certificate"),
    ],
)
def test_a_pair_that_cannot_be_served_is_exit_2(tmp_path: Path, damage: str, words: str) -> None:
    served = ensure(tmp_path)
    if damage == "cert":
        served.cert_path.write_bytes(b"garbage")
    elif damage == "key":
        served.key_path.write_bytes(b"garbage")
    else:
        served.key_path.write_bytes(generate_self_signed("h", [], NOW)[1])
    with pytest.raises(StartupError) as caught:
        ensure(tmp_path)
    assert caught.value.message == f"cannot serve {served.cert_path} with {served.key_path}: {words}"
    assert b"PRIVATE" not in caught.value.message.encode()


def test_an_expired_self_signed_certificate_is_replaced(tmp_path: Path) -> None:
    first = ensure(tmp_path)
    later = NOW + SELF_SIGNED_VALIDITY + dt.timedelta(seconds=1)
    second = ensure(tmp_path, now=later)
    assert second.generated
    assert second.certificate.serial_number != first.certificate.serial_number
    assert second.certificate.not_valid_after_utc == later + SELF_SIGNED_VALIDITY


def test_an_expired_operator_certificate_is_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    expired = build("m.test", "CA", leaf_key.public_key(), ca_key, not_after=NOW - dt.timedelta(days=1))
    (tmp_path / "cert.pem").write_bytes(cert_pem(expired))
    (tmp_path / "key.pem").write_bytes(key_pem(leaf_key))
    with caplog.at_level(logging.WARNING):
        served = ensure(tmp_path)
    assert not served.generated and not served.self_signed
    assert served.cert_path.read_bytes() == cert_pem(expired)
    assert "expired" in caplog.text


def test_a_key_open_to_others_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    served = ensure(tmp_path)
    served.key_path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        ensure(tmp_path)
    assert "should be 0600" in caplog.text


def test_stale_temp_files_of_interrupted_writes_are_removed(tmp_path: Path) -> None:
    (tmp_path / ".key.pem.abcd1234.tmp").write_bytes(b"half a key")
    (tmp_path / "keep.me").write_bytes(b"not ours")
    ensure(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cert.pem", "keep.me", "key.pem"]
