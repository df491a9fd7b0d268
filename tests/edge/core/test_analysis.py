"""The FlowAnalysis facade the engine calls: the snapshot's shape and the models it feeds."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pytest

from appliance.models.stats import AudioStream, IatStats, MediaAnalysis, Tr101290Stats, VideoStream
from services.edge.core.analysis import FlowAnalysis

from .conftest import Feeder
from .tsbuild import Mux, chunk

ROOT = Path(__file__).resolve().parents[3]
FORBIDDEN = {"trio", "quart", "quart_trio", "hypercorn", "socket", "sqlite3", "time", "random", "logging"}
MY_CORE_PATHS = [
    "services/edge/core/ts",
    "services/edge/core/media",
    "services/edge/core/timing.py",
    "services/edge/core/analysis.py",
]


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_analysis_cores_do_no_io() -> None:
    files: list[Path] = []
    for rel in MY_CORE_PATHS:
        p = ROOT / rel
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    assert len(files) >= 6
    for path in files:
        assert not _top_level_imports(path) & FORBIDDEN, path


def _stream(n: int = 40) -> list[bytes]:
    mux = Mux()
    pkts: list[bytes] = []
    for i in range(n):
        pkts += [
            mux.pat(),
            mux.pmt(),
            mux.video(pcr=i * 270_000),
            mux.video(pts=i * 3600),
            mux.audio(),
            mux.video(),
            mux.video(),
        ]
    return pkts


def test_snapshot_builds_the_models(analysis_feed: Feeder) -> None:
    fa = FlowAnalysis(media_analysis=True)
    datagrams = chunk(_stream())
    times = [i * 0.01 for i in range(len(datagrams))]
    analysis_feed(fa, datagrams, times)
    snap = fa.snapshot(times[-1])
    assert json.loads(json.dumps(snap)) == snap  # JSON-ready: plain ints, floats, None
    tr = Tr101290Stats(**snap["tr101290"])  # type: ignore[arg-type]
    assert tr.ts_packets_analyzed == 280
    assert tr.pat_count == 40 and tr.pmt_count == 40
    media = snap["media"]
    assert isinstance(media, dict)
    ma = MediaAnalysis(protocol="rtp", **media)
    assert ma.program_count == 1
    assert [v.pid for v in ma.video_streams] == [0x101]
    assert [a.pid for a in ma.audio_streams] == [0x102]
    assert ma.audio_streams[0].language == "eng"
    assert isinstance(ma.video_streams[0], VideoStream) and isinstance(ma.audio_streams[0], AudioStream)
    iat = IatStats(**snap["iat"])  # type: ignore[arg-type]
    assert iat.min_us == pytest.approx(10_000) and iat.max_us == pytest.approx(10_000)
    assert snap["pdv_jitter_us"] is not None  # PCR-based: no RTP timestamps


def test_media_is_none_when_off_and_iat_none_before_two_datagrams() -> None:
    fa = FlowAnalysis(media_analysis=False)
    assert fa.snapshot(0.0) == {
        "tr101290": fa.snapshot(0.0)["tr101290"],
        "media": None,
        "iat": None,
        "pdv_jitter_us": None,
    }
    fa.on_datagram(memoryview(chunk(_stream(1))[0]), 0.0, 1000)
    assert fa.snapshot(0.0)["iat"] is None


def test_rtp_timestamps_drive_the_jitter() -> None:
    fa = FlowAnalysis(media_analysis=False)
    datagrams = chunk(_stream())
    for i, d in enumerate(datagrams):
        late = 0.002 if i == 20 else 0.0
        fa.on_datagram(memoryview(d), i * 0.01 + late, i * 900)
    jitter = fa.snapshot(1.0)["pdv_jitter_us"]
    assert isinstance(jitter, float)
    # RFC 3550 §6.4.1: |D| = 2 ms twice (late, then back on time), then 18 samples of D = 0.
    j = 2000 / 16
    j += (2000 - j) / 16
    j *= (15 / 16) ** (len(datagrams) - 22)
    assert jitter == pytest.approx(j, rel=1e-6)


def test_priority_flags_recover_after_the_window() -> None:
    fa = FlowAnalysis(media_analysis=False)
    d = bytearray(chunk(_stream(1))[0])
    d[188] = 0x00  # one bad sync byte
    fa.on_datagram(memoryview(bytes(d)), 0.0, None)
    assert fa.snapshot(1.0)["tr101290"]["priority1_ok"] is False  # type: ignore[index]
    assert fa.snapshot(10.5)["tr101290"]["priority1_ok"] is True  # type: ignore[index]


def test_random_bytes_never_raise_and_are_counted() -> None:
    rng = random.Random(1)
    fa = FlowAnalysis(media_analysis=True)
    for i in range(300):
        n = rng.choice([0, 1, 100, 188, 1316, 1400])
        fa.on_datagram(memoryview(rng.randbytes(n)), i * 0.001, None)
    fa.on_batch([memoryview(rng.randbytes(1316)) for _ in range(64)], [0.5] * 64, [None] * 64)
    snap = fa.snapshot(1.0)
    assert fa.internal_errors == 0, fa.last_internal_error
    Tr101290Stats(**snap["tr101290"])  # type: ignore[arg-type]
    assert snap["tr101290"]["sync_byte_errors"] > 0  # type: ignore[index]
