"""SrtLeg (interop.md 2.4) → libsrt socket options, set before bind/connect.

``socket_options(leg)`` is pure: it returns the ordered ``(option, value)`` list, so a
test can read it as a table. ``apply_options`` sets them on a socket; ``check_supported``
is the 400 gate: it rejects what this libsrt cannot do (aes-gcm and max_rexmit_bw on
1.5.1) and dry-runs every option on a scratch socket so that a value libsrt refuses
is reported at configuration time, not when the flow starts.
"""

from __future__ import annotations

from typing import Final

from appliance.errors import InvalidInput
from appliance.models.config import SrtLeg

from . import binding as b

_RETRANSMIT_ALGO: Final = {"default": 0, "reduced": 1}
_CRYPTO_MODE_AES_GCM: Final = 2  # SRT_CRYPTOMODE_AES_GCM (libsrt >= 1.5.2 with AEAD)

_NAMES: Final = {value: name for name, value in vars(b).items() if name.startswith("SRTO_") and isinstance(value, int)}


def option_name(opt: int) -> str:
    """``SRTO_LATENCY`` for 23: for messages."""
    return _NAMES.get(opt, f"option {opt}")


def socket_options(leg: SrtLeg) -> list[tuple[int, b.OptionValue]]:
    """The pre-bind/pre-connect options for ``leg``, in the order they must be set.

    Order matters to libsrt: SRTO_TRANSTYPE resets every option to the live-mode
    defaults, so it comes first; SRTO_LATENCY sets both directions, so RCV/PEER
    latency override it after; SRTO_MSS bounds SRTO_PAYLOADSIZE; SRTO_KMREFRESHRATE
    rewrites SRTO_KMPREANNOUNCE. Unset (None) fields keep libsrt's defaults. The
    non-blocking flags (SNDSYN/RCVSYN false) are the I/O layer's, not here.
    """
    opts: list[tuple[int, b.OptionValue]] = [
        (b.SRTO_TRANSTYPE, b.SRTT_LIVE),
        (b.SRTO_LATENCY, leg.latency_ms),
    ]
    if leg.recv_latency_ms is not None:
        opts.append((b.SRTO_RCVLATENCY, leg.recv_latency_ms))
    if leg.peer_latency_ms is not None:
        opts.append((b.SRTO_PEERLATENCY, leg.peer_latency_ms))
    opts.append((b.SRTO_PEERIDLETIMEO, leg.peer_idle_timeout_secs * 1000))
    if leg.passphrase is not None:
        opts.append((b.SRTO_PASSPHRASE, leg.passphrase))
        opts.append((b.SRTO_PBKEYLEN, leg.effective_key_len or 16))
        if leg.crypto_mode == "aes-gcm":
            opts.append((b.SRTO_CRYPTOMODE, _CRYPTO_MODE_AES_GCM))
    if leg.enforced_encryption is not None:
        opts.append((b.SRTO_ENFORCEDENCRYPTION, leg.enforced_encryption))
    if leg.km_refresh_rate is not None:
        opts.append((b.SRTO_KMREFRESHRATE, leg.km_refresh_rate))
    if leg.km_pre_announce is not None:
        opts.append((b.SRTO_KMPREANNOUNCE, leg.km_pre_announce))
    if leg.stream_id is not None:
        opts.append((b.SRTO_STREAMID, leg.stream_id))
    if leg.packet_filter is not None:
        opts.append((b.SRTO_PACKETFILTER, leg.packet_filter))
    if leg.max_bw is not None:
        opts.append((b.SRTO_MAXBW, leg.max_bw))
    if leg.input_bw is not None:
        opts.append((b.SRTO_INPUTBW, leg.input_bw))
    if leg.overhead_bw is not None:
        opts.append((b.SRTO_OHEADBW, leg.overhead_bw))
    if leg.max_rexmit_bw is not None and leg.max_rexmit_bw != -1:
        opts.append((b.SRTO_MAXREXMITBW, leg.max_rexmit_bw))
    if leg.connect_timeout_secs is not None:
        opts.append((b.SRTO_CONNTIMEO, leg.connect_timeout_secs * 1000))
    if leg.mss is not None:
        opts.append((b.SRTO_MSS, leg.mss))
    if leg.flight_flag_size is not None:
        opts.append((b.SRTO_FC, leg.flight_flag_size))
    if leg.send_buffer_size is not None:
        opts.append((b.SRTO_SNDBUF, leg.send_buffer_size))
    if leg.recv_buffer_size is not None:
        opts.append((b.SRTO_RCVBUF, leg.recv_buffer_size))
    if leg.ip_tos is not None:
        opts.append((b.SRTO_IPTOS, leg.ip_tos))
    if leg.ip_ttl is not None:
        opts.append((b.SRTO_IPTTL, leg.ip_ttl))
    if leg.payload_size is not None:
        opts.append((b.SRTO_PAYLOADSIZE, leg.payload_size))
    if leg.tlpkt_drop is not None:
        opts.append((b.SRTO_TLPKTDROP, leg.tlpkt_drop))
    if leg.retransmit_algo is not None:
        opts.append((b.SRTO_RETRANSMITALGO, _RETRANSMIT_ALGO[leg.retransmit_algo]))
    if leg.send_drop_delay is not None:
        opts.append((b.SRTO_SNDDROPDELAY, leg.send_drop_delay))
    if leg.loss_max_ttl is not None:
        opts.append((b.SRTO_LOSSMAXTTL, leg.loss_max_ttl))
    return opts


def apply_options(sock: int, leg: SrtLeg) -> None:
    """Set every option of ``leg`` on ``sock``; raises SrtError naming the option."""
    for opt, value in socket_options(leg):
        try:
            b.setsockflag(sock, opt, value)
        except b.SrtError as exc:
            shown = "***" if opt == b.SRTO_PASSPHRASE else repr(value)
            raise b.SrtError(f"libsrt refused {option_name(opt)}={shown}: {exc.message}", exc.code) from exc


def check_supported(leg: SrtLeg) -> None:
    """Raise InvalidInput (HTTP 400) when this libsrt cannot run ``leg``.

    An SrtInput/SrtOutput's ``redundancy`` leg is checked too. Checks the optional
    features against what the loaded library supports (probed:
    aes-gcm needs libsrt >= 1.5.2 built with ENABLE_AEAD_API_PREVIEW, max_rexmit_bw
    needs >= 1.5.4 with ENABLE_MAXREXMITBW), then sets every option on a scratch
    socket, so that a combination libsrt refuses (say payload_size above mss - 44)
    is a clear 400. Touches no network. Messages never contain the passphrase.
    """
    info = b.library_info()
    version = ".".join(map(str, info.version))
    if leg.passphrase is not None and leg.crypto_mode == "aes-gcm" and not info.aes_gcm:
        raise InvalidInput(
            f"crypto_mode aes-gcm is not supported by the installed libsrt {version} "
            "(it needs libsrt 1.5.2 or later built with AEAD support); use aes-ctr"
        )
    if leg.max_rexmit_bw is not None and leg.max_rexmit_bw != -1 and not info.max_rexmit_bw:
        raise InvalidInput(
            f"max_rexmit_bw is not supported by the installed libsrt {version}; leave it unset or -1 (unlimited)"
        )
    sock = b.create_socket()
    try:
        apply_options(sock, leg)
    except b.SrtError as exc:
        raise InvalidInput(f"invalid SRT settings: {exc.message}") from exc
    finally:
        b.close(sock)
    second = getattr(leg, "redundancy", None)
    if isinstance(second, SrtLeg):
        try:
            check_supported(second)
        except InvalidInput as exc:
            raise InvalidInput(f"redundancy leg: {exc.message}") from exc
