"""Basic (RFC 7617) and Digest (RFC 2617, RFC 7616) against the RFCs' own test vectors."""

from __future__ import annotations

import hashlib

import pytest

from services.edge.core.rtsp import Authenticator, Challenge, choose_challenge, digest_response, parse_challenges

# RFC 7616 §3.9.1
RFC7616 = {
    "username": "Mufasa",
    "password": "Circle of Life",
    "realm": "http-auth@example.org",
    "nonce": "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
    "method": "GET",
    "uri": "/dir/index.html",
    "qop": "auth",
    "nc": "00000001",
    "cnonce": "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
}
RFC7616_OPAQUE = "FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"
RFC7616_HEADER = (
    'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm={alg}, '
    'nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"'
)


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_rfc_7616_vectors(algorithm: str, expected: str) -> None:
    assert digest_response(algorithm=algorithm, **RFC7616) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_authenticator_builds_the_rfc_7616_header(algorithm: str, expected: str) -> None:
    (challenge,) = parse_challenges([RFC7616_HEADER.format(alg=algorithm)])
    auth = Authenticator("Mufasa", "Circle of Life", lambda: RFC7616["cnonce"])
    auth.use(challenge)
    value = auth.authorization("GET", "/dir/index.html")
    assert value == (
        'Digest username="Mufasa", realm="http-auth@example.org", '
        'nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", uri="/dir/index.html", '
        f'response="{expected}", algorithm={algorithm}, opaque="{RFC7616_OPAQUE}", qop=auth, nc=00000001, '
        'cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"'
    )


def test_rfc_2617_md5_qop_auth_vector() -> None:
    # RFC 2617 §3.5 (its example header omits qop=auth's A2 body; response as published)
    response = digest_response(
        algorithm="MD5",
        username="Mufasa",
        password="Circle Of Life",
        realm="testrealm@host.com",
        nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
        method="GET",
        uri="/dir/index.html",
        qop="auth",
        nc="00000001",
        cnonce="0a4f113b",
    )
    assert response == "6629fae49393a05397450978507c4ef1"


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def test_md5_without_qop_rfc_2069() -> None:
    (challenge,) = parse_challenges(['Digest realm="IP Camera(C6214)", nonce="abc123", stale="FALSE"'])
    auth = Authenticator("admin", "pw", lambda: "unused")
    auth.use(challenge)
    value = auth.authorization("DESCRIBE", "rtsp://10.0.0.2:554/live")
    ha1, ha2 = md5("admin:IP Camera(C6214):pw"), md5("DESCRIBE:rtsp://10.0.0.2:554/live")
    assert value == (
        'Digest username="admin", realm="IP Camera(C6214)", nonce="abc123", uri="rtsp://10.0.0.2:554/live", '
        f'response="{md5(f"{ha1}:abc123:{ha2}")}"'
    )


def test_nc_counts_per_nonce_and_restarts_on_a_new_one() -> None:
    cnonces = iter(["c1", "c2", "c3"])
    auth = Authenticator("u", "p", lambda: next(cnonces))
    auth.use(parse_challenges(['Digest realm="r", nonce="n1", qop="auth"'])[0])
    assert "nc=00000001" in auth.authorization("OPTIONS", "rtsp://h/")
    assert "nc=00000002" in auth.authorization("DESCRIBE", "rtsp://h/")
    auth.use(parse_challenges(['Digest realm="r", nonce="n2", qop="auth", stale=true'])[0])
    value = auth.authorization("SETUP", "rtsp://h/t")
    assert "nc=00000001" in value and 'nonce="n2"' in value and 'cnonce="c3"' in value


def test_md5_sess() -> None:
    (challenge,) = parse_challenges(['Digest realm="r", nonce="n", qop=auth, algorithm=MD5-sess'])
    auth = Authenticator("u", "p", lambda: "cn")
    auth.use(challenge)
    ha1 = md5(f"{md5('u:r:p')}:n:cn")
    expected = md5(f"{ha1}:n:00000001:cn:auth:{md5('PLAY:rtsp://h/')}")
    assert f'response="{expected}"' in auth.authorization("PLAY", "rtsp://h/")


def test_basic_rfc_7617() -> None:
    auth = Authenticator("Aladdin", "open sesame", lambda: "x")
    auth.use(Challenge("basic", {"realm": "WallyWorld"}))
    assert auth.authorization("OPTIONS", "rtsp://h/") == "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="


def test_parse_several_challenges_in_one_header_and_quoting() -> None:
    challenges = parse_challenges(
        ['Basic realm="a, b", Digest realm="x\\"y", nonce=abc, qop="auth,auth-int", Newauth realm="apps", type=1']
    )
    assert [c.scheme for c in challenges] == ["basic", "digest", "newauth"]
    assert challenges[0].params == {"realm": "a, b"}
    assert challenges[1].params == {"realm": 'x"y', "nonce": "abc", "qop": "auth,auth-int"}
    assert challenges[2].params == {"realm": "apps", "type": "1"}


def test_preference_sha256_then_md5_then_basic() -> None:
    headers = [
        'Basic realm="r"',
        'Digest realm="r", nonce="1"',
        'Digest realm="r", nonce="2", algorithm=SHA-256',
        'Digest realm="r", nonce="3", algorithm=SHA-512-256',
    ]
    chosen = choose_challenge(parse_challenges(headers))
    assert chosen is not None and chosen.params["nonce"] == "2"
    chosen = choose_challenge(parse_challenges(headers[:2]))
    assert chosen is not None and chosen.scheme == "digest"
    chosen = choose_challenge(parse_challenges(headers[:1]))
    assert chosen is not None and chosen.scheme == "basic"


@pytest.mark.parametrize(
    "header",
    ["Negotiate", 'Digest realm="r"', 'Digest realm="r", nonce="n", algorithm=SHA-512-256', "NTLM abc=="],
)
def test_unsupported_challenges(header: str) -> None:
    assert choose_challenge(parse_challenges([header])) is None


def test_repr_hides_the_password() -> None:
    auth = Authenticator("user", "hunter2-secret", lambda: "x")
    assert "hunter2" not in repr(auth)
