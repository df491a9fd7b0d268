#!/usr/bin/python3
"""A live RTSP test server: Debian's gst-rtsp-server driven by Debian's python3-gi.

Run by ``/usr/bin/python3`` (the project venv cannot import ``gi``); no project imports.
``tests/helpers/rtsp_server.py`` starts it for the tests. Once the server is attached it prints
exactly one line ``READY <port>`` on stdout, then serves until SIGTERM or SIGINT (exit 0).
Errors go to stderr with a non-zero exit.

Debian packages: python3-gi, gir1.2-gst-rtsp-server-1.0, gstreamer1.0-plugins-base/-good,
gstreamer1.0-plugins-ugly (x264enc), gstreamer1.0-plugins-bad (x265enc, voaacenc),
gstreamer1.0-libav (avenc_aac, the fallback AAC encoder); gstreamer1.0-x (timeoverlay) is
optional: without it the picture has no clock.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import NoReturn

try:
    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtsp", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import Gio, GLib, Gst, GstRtsp, GstRtspServer
except (ImportError, ValueError) as exc:  # ValueError: the typelib is missing
    print(
        f"gst_rtsp_server: cannot load gst-rtsp-server through python3-gi ({exc}); "
        "install python3-gi and gir1.2-gst-rtsp-server-1.0",
        file=sys.stderr,
    )
    sys.exit(3)  # EXIT_MISSING

VIDEO_CODECS = ("h264", "h265")
AUDIO_MODES = ("aac-hbr", "aac-latm", "none")
AUTH_MODES = ("none", "basic", "digest")
ROLE = "tester"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0, help="0: pick a free port (printed in READY)")
    p.add_argument("--mount", default="/cam")
    p.add_argument("--video", choices=VIDEO_CODECS, default="h264")
    p.add_argument("--audio", choices=AUDIO_MODES, default="aac-hbr")
    p.add_argument("--protocols", default="tcp,udp", help="comma list of tcp, udp, udp-mcast")
    p.add_argument("--auth", choices=AUTH_MODES, default="none")
    p.add_argument("--user", default="user")
    p.add_argument("--password", default="password")
    p.add_argument("--fps", type=int, default=25)
    p.add_argument("--size", default="320x240", help="WIDTHxHEIGHT")
    p.add_argument("--gop", type=int, default=25, help="key frame interval in frames")
    p.add_argument("--bitrate-kbps", type=int, default=1000)
    p.add_argument(
        "--cbr", action="store_true", help="H.264 at exactly --bitrate-kbps (x264 CBR with filler data, nal-hrd=cbr)"
    )
    p.add_argument("--tls-cert", default=None, help="PEM certificate: serve RTSP over TLS (rtsps://)")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument("--check", action="store_true", help="only check that every element is installed, then exit 0")
    args = p.parse_args(argv)
    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        p.error(f"--size must be WIDTHxHEIGHT, not {args.size!r}")
    args.width, args.height = w, h
    if not args.mount.startswith("/"):
        p.error("--mount must start with /")
    return args


# Which Debian 12 package ships each element we use (for the error, and the tests' skip reason).
ELEMENT_PACKAGES = {
    "videotestsrc": "gstreamer1.0-plugins-base",
    "videoconvert": "gstreamer1.0-plugins-base",
    "audiotestsrc": "gstreamer1.0-plugins-base",
    "audioconvert": "gstreamer1.0-plugins-base",
    "audioresample": "gstreamer1.0-plugins-base",
    "rtph264pay": "gstreamer1.0-plugins-good",
    "rtph265pay": "gstreamer1.0-plugins-good",
    "rtpmp4gpay": "gstreamer1.0-plugins-good",
    "rtpmp4apay": "gstreamer1.0-plugins-good",
    "x264enc": "gstreamer1.0-plugins-ugly",
    "x265enc": "gstreamer1.0-plugins-bad",
    "voaacenc": "gstreamer1.0-plugins-bad",
    "avenc_aac": "gstreamer1.0-libav",
    "timeoverlay": "gstreamer1.0-x",
}
EXIT_MISSING = 3


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"gst_rtsp_server: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def need_elements(names: list[str]) -> None:
    missing = [n for n in names if Gst.ElementFactory.find(n) is None]
    if missing:
        what = ", ".join(f"{n} (Debian package {ELEMENT_PACKAGES.get(n, '?')})" for n in missing)
        fail(f"GStreamer elements missing: {what}", EXIT_MISSING)


def aac_encoder() -> str:
    if Gst.ElementFactory.find("voaacenc") is not None:
        return "voaacenc bitrate=128000"
    if Gst.ElementFactory.find("avenc_aac") is not None:
        return "avenc_aac bitrate=128000"
    fail(
        "no AAC encoder: voaacenc (Debian package gstreamer1.0-plugins-bad) "
        "or avenc_aac (Debian package gstreamer1.0-libav)",
        EXIT_MISSING,
    )


# A plain test pattern codes to well under any bit rate asked; a broadcast encoder in CBR mode
# pads with filler NAL units (H.264 7.3.2.7) to the rate: x264's nal-hrd=cbr with filler.
CBR = 'pass=cbr vbv-buf-capacity=1000 option-string="nal-hrd=cbr:filler=1" '


def launch_line(args: argparse.Namespace) -> str:
    """The media factory's pipeline: live test sources, pay0 = video (pt 96), pay1 = audio (pt 97)."""
    overlay = ""
    if Gst.ElementFactory.find("timeoverlay") is not None:
        overlay = "! timeoverlay "  # untested here: gstreamer1.0-x is not installed
    caps = f"video/x-raw,width={args.width},height={args.height},framerate={args.fps}/1"
    if args.video == "h264":
        need_elements(["x264enc", "rtph264pay"])
        enc = (
            f"x264enc tune=zerolatency speed-preset=ultrafast key-int-max={args.gop} "
            f"bitrate={args.bitrate_kbps} {CBR if args.cbr else ''}! video/x-h264,profile=baseline "
            "! rtph264pay name=pay0 pt=96 config-interval=-1"
        )
    else:
        need_elements(["x265enc", "rtph265pay"])
        enc = (
            f"x265enc tune=zerolatency speed-preset=ultrafast key-int-max={args.gop} option-string=open-gop=0 "
            f"bitrate={args.bitrate_kbps} ! video/x-h265,profile=main "
            "! rtph265pay name=pay0 pt=96 config-interval=-1"
        )
    need_elements(["videotestsrc", "videoconvert"])
    video = f"videotestsrc is-live=true pattern=ball ! {caps} {overlay}! videoconvert ! {enc}"
    if args.audio == "none":
        return f"( {video} )"
    need_elements(["audiotestsrc", "audioconvert", "audioresample"])
    pay = "rtpmp4gpay" if args.audio == "aac-hbr" else "rtpmp4apay"
    need_elements([pay])
    audio = (
        "audiotestsrc is-live=true wave=sine freq=440 volume=0.3 ! audioconvert ! audioresample "
        f"! audio/x-raw,rate=48000,channels=2 ! {aac_encoder()} ! {pay} name=pay1 pt=97"
    )
    return f"( {video} {audio} )"


def lower_trans(spec: str) -> GstRtsp.RTSPLowerTrans:
    names = {
        "tcp": GstRtsp.RTSPLowerTrans.TCP,
        "udp": GstRtsp.RTSPLowerTrans.UDP,
        "udp-mcast": GstRtsp.RTSPLowerTrans.UDP_MCAST,
    }
    mask = GstRtsp.RTSPLowerTrans(0)
    for name in (s.strip().lower() for s in spec.split(",")):
        if name not in names:
            fail(f"unknown protocol {name!r} (tcp, udp, udp-mcast)")
        mask |= names[name]
    if not mask:
        fail("--protocols is empty")
    return mask


def setup_auth(
    server: GstRtspServer.RTSPServer, factory: GstRtspServer.RTSPMediaFactory, a: argparse.Namespace
) -> None:
    if a.auth == "none" and not a.tls_cert:
        return
    auth = GstRtspServer.RTSPAuth()
    token = GstRtspServer.RTSPToken()
    token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, ROLE)
    if a.tls_cert:
        try:
            auth.set_tls_certificate(Gio.TlsCertificate.new_from_files(a.tls_cert, a.tls_key or a.tls_cert))
        except GLib.Error as exc:
            fail(f"cannot load the TLS certificate: {exc.message}")
    if a.auth == "none":  # TLS only: every client gets the role (an RTSPAuth denies by default)
        auth.set_default_token(token)
    elif a.auth == "basic":
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(a.user, a.password), token)
        auth.set_supported_methods(GstRtsp.RTSPAuthMethod.BASIC)
    else:
        auth.add_digest(a.user, a.password, token)
        auth.set_supported_methods(GstRtsp.RTSPAuthMethod.DIGEST)
    server.set_auth(auth)
    perms = GstRtspServer.RTSPPermissions()
    perms.add_permission_for_role(ROLE, GstRtspServer.RTSP_PERM_MEDIA_FACTORY_ACCESS, True)
    perms.add_permission_for_role(ROLE, GstRtspServer.RTSP_PERM_MEDIA_FACTORY_CONSTRUCT, True)
    factory.set_permissions(perms)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Gst.init(None)
    launch = launch_line(args)
    if args.check:
        try:
            Gst.parse_launch(launch.strip("() "))
        except GLib.Error as exc:
            fail(f"the pipeline does not build: {exc.message}")
        print("OK", flush=True)
        return 0
    port = args.port  # 0: the kernel picks one; get_bound_port() says which
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    factory.set_shared(True)
    factory.set_protocols(lower_trans(args.protocols))
    setup_auth(server, factory, args)
    server.get_mount_points().add_factory(args.mount, factory)

    loop = GLib.MainLoop()

    def on_signal(*_: object) -> bool:
        loop.quit()
        return False  # GLib.SOURCE_REMOVE

    GLib.unix_signal_add(GLib.PRIORITY_HIGH, signal.SIGTERM, on_signal)
    GLib.unix_signal_add(GLib.PRIORITY_HIGH, signal.SIGINT, on_signal)
    try:
        source_id = server.attach(None)
    except GLib.Error as exc:
        print(f"gst_rtsp_server: cannot listen on 127.0.0.1:{port}: {exc.message}", file=sys.stderr)
        return 2
    if source_id == 0:
        print(f"gst_rtsp_server: cannot listen on 127.0.0.1:{port}", file=sys.stderr)
        return 2
    print(f"READY {server.get_bound_port()}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
