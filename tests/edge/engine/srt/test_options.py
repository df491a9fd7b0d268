"""SrtLeg → libsrt options: every field is set, and libsrt reads back what we set."""

from __future__ import annotations

import pytest

from appliance.errors import InvalidInput
from appliance.models.config import SrtLeg, SrtOutput
from services.edge.engine.srt import binding as b
from services.edge.engine.srt.options import apply_options, check_supported, socket_options

FULL_LEG = SrtLeg(
    mode="caller",
    local_addr="0.0.0.0:0",
    remote_addr="127.0.0.1:9000",
    latency_ms=300,
    recv_latency_ms=400,
    peer_latency_ms=500,
    peer_idle_timeout_secs=7,
    passphrase="0123456789abcdef",
    aes_key_len=32,
    crypto_mode="aes-ctr",
    stream_id="#!::r=feed1,m=publish,u=edge",
    packet_filter="fec,cols:10,rows:5,layout:staircase,arq:onreq",
    max_rexmit_bw=-1,
    max_bw=12_500_000,
    input_bw=5_000_000,
    overhead_bw=30,
    enforced_encryption=False,
    tlpkt_drop=False,
    connect_timeout_secs=4,
    flight_flag_size=12_000,
    send_buffer_size=4_000_000,
    recv_buffer_size=4_000_000,
    ip_tos=0xB8,
    ip_ttl=17,
    retransmit_algo="reduced",
    send_drop_delay=250,
    loss_max_ttl=3,
    km_refresh_rate=1_000_000,
    km_pre_announce=5_000,
    payload_size=1316,
    mss=1400,
)

# (option, value libsrt reads back) for FULL_LEG. SRTO_LATENCY reads as the receive
# latency; buffers round down to whole packets; the passphrase and transtype are write-only.
EXPECTED_READBACK = [
    (b.SRTO_RCVLATENCY, 400),
    (b.SRTO_PEERLATENCY, 500),
    (b.SRTO_PEERIDLETIMEO, 7000),
    (b.SRTO_PBKEYLEN, 32),
    (b.SRTO_ENFORCEDENCRYPTION, False),
    (b.SRTO_KMREFRESHRATE, 1_000_000),
    (b.SRTO_KMPREANNOUNCE, 5_000),
    (b.SRTO_STREAMID, "#!::r=feed1,m=publish,u=edge"),
    (b.SRTO_PACKETFILTER, "fec,cols:10,rows:5,layout:staircase,arq:onreq"),
    (b.SRTO_MAXBW, 12_500_000),
    (b.SRTO_INPUTBW, 5_000_000),
    (b.SRTO_OHEADBW, 30),
    (b.SRTO_CONNTIMEO, 4000),
    (b.SRTO_MSS, 1400),
    (b.SRTO_FC, 12_000),
    (b.SRTO_IPTOS, 0xB8),
    (b.SRTO_IPTTL, 17),
    (b.SRTO_PAYLOADSIZE, 1316),
    (b.SRTO_TLPKTDROP, False),
    (b.SRTO_RETRANSMITALGO, 1),
    (b.SRTO_SNDDROPDELAY, 250),
    (b.SRTO_LOSSMAXTTL, 3),
]


def test_every_field_maps_to_an_option() -> None:
    opts = dict(socket_options(FULL_LEG))
    assert socket_options(FULL_LEG)[0] == (b.SRTO_TRANSTYPE, b.SRTT_LIVE)  # first: it resets the rest
    assert opts[b.SRTO_LATENCY] == 300
    assert opts[b.SRTO_PASSPHRASE] == "0123456789abcdef"
    assert opts[b.SRTO_SNDBUF] == opts[b.SRTO_RCVBUF] == 4_000_000
    for opt, value in EXPECTED_READBACK:
        assert opt in opts, opt
        assert opts[opt] == value, opt
    assert b.SRTO_MAXREXMITBW not in opts  # -1 is libsrt's default (unlimited): nothing to set
    assert b.SRTO_CRYPTOMODE not in opts  # aes-ctr is what libsrt 1.5.1 does anyway


def test_defaults_set_only_the_mandatory_options() -> None:
    leg = SrtLeg(mode="listener", local_addr="127.0.0.1:9000")
    assert socket_options(leg) == [
        (b.SRTO_TRANSTYPE, b.SRTT_LIVE),
        (b.SRTO_LATENCY, 120),
        (b.SRTO_PEERIDLETIMEO, 30_000),
    ]


def test_passphrase_defaults_to_aes_128() -> None:
    leg = SrtLeg(mode="listener", local_addr="127.0.0.1:9000", passphrase="0123456789")
    assert dict(socket_options(leg))[b.SRTO_PBKEYLEN] == 16


@pytest.mark.parametrize(("opt", "expected"), EXPECTED_READBACK, ids=lambda v: str(v))
def test_libsrt_reads_back_what_was_applied(opt: int, expected: object) -> None:
    sock = b.create_socket()
    try:
        apply_options(sock, FULL_LEG)
        assert b.getsockflag(sock, opt) == expected
    finally:
        b.close(sock)


def test_buffers_are_applied_in_bytes() -> None:
    sock = b.create_socket()
    try:
        apply_options(sock, FULL_LEG)
        for opt in (b.SRTO_SNDBUF, b.SRTO_RCVBUF):
            value = b.getsockflag(sock, opt)
            assert isinstance(value, int)
            assert 3_900_000 <= value <= 4_000_000  # rounded to whole packets by libsrt
    finally:
        b.close(sock)


def test_full_leg_is_supported() -> None:
    check_supported(FULL_LEG)


def test_aes_gcm_is_a_clear_invalid_input_when_libsrt_lacks_it() -> None:
    leg = FULL_LEG.model_copy(update={"crypto_mode": "aes-gcm", "aes_key_len": 16})
    if b.library_info().aes_gcm:
        check_supported(leg)  # a libsrt with AEAD takes it
        return
    with pytest.raises(InvalidInput, match=r"aes-gcm is not supported by the installed libsrt 1\.5"):
        check_supported(leg)


def test_max_rexmit_bw_needs_library_support() -> None:
    leg = FULL_LEG.model_copy(update={"max_rexmit_bw": 1_000_000})
    if b.library_info().max_rexmit_bw:
        check_supported(leg)
        return
    with pytest.raises(InvalidInput, match="max_rexmit_bw is not supported"):
        check_supported(leg)


def test_a_combination_libsrt_refuses_is_invalid_input_without_the_passphrase() -> None:
    # payload_size must fit in mss - 44 (IP/UDP 28 + SRT 16): libsrt refuses 1456 with mss 1000.
    leg = FULL_LEG.model_copy(update={"mss": 1000, "payload_size": 1456})
    with pytest.raises(InvalidInput, match="SRTO_PAYLOADSIZE") as info:
        check_supported(leg)
    assert FULL_LEG.passphrase not in info.value.message


def test_library_info_reports_the_debian_build() -> None:
    info = b.library_info()
    assert info.version[:2] == (1, 5)
    assert info.name.startswith("libsrt")


def test_the_redundancy_leg_is_checked_too() -> None:
    output = SrtOutput(
        id="o1",
        name="out",
        mode="caller",
        local_addr="0.0.0.0:0",
        remote_addr="127.0.0.1:9000",
        redundancy=FULL_LEG.model_copy(update={"mss": 1000, "payload_size": 1456}),
    )
    with pytest.raises(InvalidInput, match=r"^redundancy leg: invalid SRT settings"):
        check_supported(output)
