"""The engine's kind registry: input and output ``type`` -> driver.

What a kind *is* (config model, labels, NMOS transport, event category, listening
addresses, CLI URL) is declared once in ``appliance.models.kinds``; this table adds how
the engine runs it. A kind declared there without a driver here is refused with a 400
("not supported by this edge yet"). ``tests/edge/engine/test_kinds.py`` walks both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from appliance import errors
from appliance.models.config import FlowConfig, OutputConfig
from appliance.models.kinds import INPUT_KINDS, OUTPUT_KINDS
from services.edge.engine.kinds.base import FlowPort, InputDriver, OutputDriver
from services.edge.engine.kinds.hls_output import HlsOutputDriver
from services.edge.engine.kinds.rtmp import RtmpInputDriver
from services.edge.engine.kinds.rtmp_output import RtmpOutputDriver
from services.edge.engine.kinds.rtp import RtpInputDriver
from services.edge.engine.kinds.rtsp import RtspInputDriver
from services.edge.engine.kinds.srt import SrtInputDriver, SrtOutputDriver, check_srt_supported
from services.edge.engine.kinds.udp import UdpInputDriver, open_udp_output
from services.edge.engine.kinds.webrtc import WebrtcInputDriver, open_webrtc_output
from services.edge.engine.udp import FlowStartError

InputFactory = Callable[[Any, FlowPort], InputDriver]
OutputFactory = Callable[[Any, FlowPort], OutputDriver]

INPUT_DRIVERS: Final[dict[str, InputFactory]] = {
    "rtp": RtpInputDriver,
    "udp": UdpInputDriver,
    "srt": SrtInputDriver,
    "rtmp": RtmpInputDriver,
    "rtsp": RtspInputDriver,
    "webrtc": WebrtcInputDriver,
    "whep": WebrtcInputDriver,
}
OUTPUT_DRIVERS: Final[dict[str, OutputFactory]] = {
    "rtp": open_udp_output,
    "udp": open_udp_output,
    "srt": SrtOutputDriver,
    "rtmp": RtmpOutputDriver,
    "hls": HlsOutputDriver,
    "webrtc": open_webrtc_output,
}
# Checks a kind needs beyond its model (what the installed libsrt supports...): 400s.
_EXTRA_CHECKS: Final[dict[str, Callable[[Any], None]]] = {"srt": check_srt_supported}

assert set(INPUT_DRIVERS) <= set(INPUT_KINDS) and set(OUTPUT_DRIVERS) <= set(OUTPUT_KINDS)


def open_input(config: Any, flow: FlowPort) -> InputDriver:
    """The driver of ``config``'s kind (not yet bound: ``open`` does that)."""
    factory = INPUT_DRIVERS.get(config.type)
    if factory is None:
        raise FlowStartError(f"input type {config.type!r} is not supported by this engine yet")
    return factory(config, flow)


def open_output(config: OutputConfig, flow: FlowPort) -> OutputDriver:
    """The driver of ``config``'s kind."""
    factory = OUTPUT_DRIVERS.get(config.type)
    if factory is None:
        raise FlowStartError(f"output type {config.type!r} is not supported by this engine yet")
    return factory(config, flow)


def check_output_supported(output: OutputConfig) -> None:
    """InvalidInput (400) for an output kind this build's engine does not carry yet."""
    if output.type not in OUTPUT_DRIVERS:
        raise errors.InvalidInput(f"output type '{output.type}' is not supported by this edge yet")
    check = _EXTRA_CHECKS.get(output.type)
    if check is not None:
        check(output)


def check_supported(flow: FlowConfig) -> None:
    """InvalidInput (400) for input or output kinds this build's engine does not carry yet."""
    if flow.input.type not in INPUT_DRIVERS:
        raise errors.InvalidInput(f"input type '{flow.input.type}' is not supported by this edge yet")
    check = _EXTRA_CHECKS.get(flow.input.type)
    if check is not None:
        check(flow.input)
    for output in flow.outputs:
        check_output_supported(output)


__all__ = [
    "INPUT_DRIVERS",
    "OUTPUT_DRIVERS",
    "FlowPort",
    "InputDriver",
    "OutputDriver",
    "check_output_supported",
    "check_supported",
    "open_input",
    "open_output",
]
