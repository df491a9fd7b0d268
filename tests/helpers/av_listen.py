"""Receive one RTMP push with FFmpeg 8 through PyAV (a test-only dependency) and record it as
MPEG-TS: Debian's ffmpeg 5.1 cannot read Enhanced RTMP (``hvc1``) FLV, FFmpeg 8 can, and a TS
recording of the HEVC is then checked with Debian's ffmpeg/ffprobe.

    python -m tests.helpers.av_listen URL OUT.ts

Listens like ``ffmpeg -listen 1 -f flv -i URL -c copy OUT.ts``: takes the first publisher,
copies its packets until it ends, exits 0 (1 with the error on stderr).
"""

from __future__ import annotations

import errno
import sys

import av


def record(url: str, out_path: str) -> int:
    source = av.open(url, "r", format="flv", options={"listen": "1"})
    sink = av.open(out_path, "w", format="mpegts")
    mapping = {stream.index: sink.add_stream_from_template(stream) for stream in source.streams}
    copied = 0
    try:
        for packet in source.demux():
            if packet.dts is None:  # the flush packet at the end of each stream
                continue
            packet.stream = mapping[packet.stream.index]
            sink.mux(packet)
            copied += 1
    except OSError as exc:
        # FFmpeg's RTMP listener ignores FCUnpublish/deleteStream and reports the publisher's
        # close as EIO (as `ffmpeg -listen 1` prints "Input/output error"): the end, once media came.
        if exc.errno != errno.EIO or copied == 0:
            raise
    sink.close()
    source.close()
    return copied


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tests.helpers.av_listen URL OUT.ts", file=sys.stderr)
        return 2
    try:
        copied = record(args[0], args[1])
    except Exception as exc:  # the test reads this line
        print(f"recording failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"copied {copied} packets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
