"""Publish a test pattern over RTMP(S) with FFmpeg 8 through PyAV (a test-only dependency):
Debian's ffmpeg 5.1 cannot speak Enhanced RTMP, so this is the encoder for HEVC (``hvc1``).

    python -m tests.helpers.av_publish URL [--codec hevc|h264] [--seconds 3] [--size 320x240]

Video: a moving gradient at 25 fps (libx265 or libx264, a keyframe each second); audio: a
1 kHz AAC tone at 48 kHz. Paced in real time (like ``ffmpeg -re``), so a receiver sees a live
stream. Exits 0 when everything was sent; prints the error and exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import fractions
import sys
import time

import av
import numpy as np

FPS = 25
SAMPLE_RATE = 48_000
AUDIO_FRAME = 1024


def publish(url: str, codec: str, seconds: float, width: int, height: int) -> None:
    out = av.open(url, "w", format="flv")
    video = out.add_stream("libx265" if codec == "hevc" else "libx264", rate=FPS)
    video.width, video.height, video.pix_fmt = width, height, "yuv420p"
    video.options = (
        {"x265-params": f"keyint={FPS}:min-keyint={FPS}:log-level=error"}
        if codec == "hevc"
        else {"g": str(FPS), "preset": "veryfast"}
    )
    audio = out.add_stream("aac", rate=SAMPLE_RATE)
    audio.layout = "stereo"
    start = time.monotonic()
    samples_sent = 0
    ramp = np.linspace(0, 255, width, dtype=np.uint8)
    for index in range(int(seconds * FPS)):
        image = np.empty((height, width, 3), dtype=np.uint8)
        image[:] = np.roll(ramp, index * 4)[None, :, None]
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts, frame.time_base = index, fractions.Fraction(1, FPS)
        for packet in video.encode(frame):
            out.mux(packet)
        while samples_sent < (index + 1) * SAMPLE_RATE // FPS:  # audio keeps pace with video
            t = (np.arange(AUDIO_FRAME) + samples_sent) / SAMPLE_RATE
            tone = (0.2 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
            chunk = av.AudioFrame.from_ndarray(np.stack([tone, tone]), format="fltp", layout="stereo")
            chunk.sample_rate, chunk.pts = SAMPLE_RATE, samples_sent
            chunk.time_base = fractions.Fraction(1, SAMPLE_RATE)
            for packet in audio.encode(chunk):
                out.mux(packet)
            samples_sent += AUDIO_FRAME
        ahead = start + (index + 1) / FPS - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)  # real-time pacing of a live publisher (not a test wait)
    for stream in (video, audio):
        for packet in stream.encode():
            out.mux(packet)
    out.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.av_publish", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--codec", choices=("hevc", "h264"), default="hevc")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--size", default="320x240")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    try:
        publish(args.url, args.codec, args.seconds, width, height)
    except Exception as exc:  # the test reads this line
        print(f"publish failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
