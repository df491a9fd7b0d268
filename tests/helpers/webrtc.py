"""WHIP (RFC 9725) and WHEP clients for the edge's WebRTC tests: Chromium pages (driven through
playwright's sync API) and aiortc clients (asyncio, with sync entry points for ``trio.to_thread``).

Edge contract: ``POST {base}/api/v1/flows/{flow_id}/whip|whep`` with ``Content-Type: application/sdp``, an SDP
offer and an optional ``Authorization: Bearer``; the answer is ``201`` with an ``application/sdp`` body, a relative
``Location`` (``DELETE {base}{Location}`` ends the session) and an ``ETag``. The edge does not trickle, so every
client here waits for its ICE gathering to complete before it POSTs (non-trickle client).

Chromium pages are served *at the edge's own origin* by playwright request interception
(``{base}/__test/whip.html``), so their ``fetch()`` to the API is same-origin. Everything playwright does must stay
in one thread: a trio test runs a whole browser session in ``trio.to_thread.run_sync``.

The ``clock`` source paints ``Date.now()`` as a block code (a reference row of alternating blocks, then 48 data
bits: the low 40 bits of the time in ms and a CRC-8 over them) that survives H.264; the viewer (or
:func:`decode_clock` on a decoded frame) reads it back and records ``Date.now() - painted`` as a latency sample.

Loopback: Chromium gathers 127.0.0.1/::1 host candidates only with ``--allow-loopback-in-peer-connection``; aioice
never gathers 127.0.0.1 (its ``get_host_addresses`` skips it), so where loopback is a host's only IPv4 (a bare
network namespace) an aiortc peer offers no candidate at all: pass ``loopback=True`` (:func:`allow_aioice_loopback`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, need_chromium

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page

# The Chromium switches a WebRTC page needs here: fake camera/microphone without a prompt, autoplay without a
# gesture, loopback candidates, and host candidates as raw IPs (not mDNS ``.local`` names, which aiortc resolves
# only through multicast DNS).
WEBRTC_ARGS = [
    *CHROMIUM_ARGS,
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]
WHIP_PAGE = "/__test/whip.html"
WHEP_PAGE = "/__test/whep.html"
GATHER_MS = 5_000  # bound on ICE gathering before the (non-trickle) POST

# --- the clock code -----------------------------------------------------------------------------------------------
CLOCK_W, CLOCK_H = 640, 360
CLOCK_BLOCKS = 24  # blocks per row
CLOCK_BW, CLOCK_BH = 24, 48  # block size (px, in the 640x360 frame)
CLOCK_X0 = (CLOCK_W - CLOCK_BLOCKS * CLOCK_BW) // 2
CLOCK_ROWS = (24, 84, 144)  # top of: reference row, data row 1 (bits 47..24), data row 2 (bits 23..0)
CLOCK_PERIOD = 2**40  # the code carries Date.now() mod 2**40 ms (34 years)

# Shared by both pages (and usable by ad-hoc pages): painting, decoding, CRC-8, bounded ICE gathering, the WHIP/
# WHEP POST, DELETE, and page error capture into ``window.__errors``.
CLOCK_JS = f"""
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e)));
window.addEventListener('unhandledrejection', e => window.__errors.push('rejection: ' + String(e.reason)));
const MP = {{W: {CLOCK_W}, H: {CLOCK_H}, N: {CLOCK_BLOCKS}, BW: {CLOCK_BW}, BH: {CLOCK_BH}, X0: {CLOCK_X0},
            ROWS: {list(CLOCK_ROWS)}, PERIOD: {CLOCK_PERIOD}}};
function mpCrc8(bytes) {{
  let crc = 0;
  for (const b of bytes) {{
    crc ^= b;
    for (let i = 0; i < 8; i++) crc = (crc & 0x80) ? ((crc << 1) ^ 0x07) & 0xff : (crc << 1) & 0xff;
  }}
  return crc;
}}
function mpBytes40(t40) {{
  const out = [];
  for (let k = 4; k >= 0; k--) out.push(Math.floor(t40 / 2 ** (8 * k)) % 256);
  return out;
}}
function mpWord(t) {{  // 48 bits: (t mod 2^40) << 8 | crc8
  const t40 = t % MP.PERIOD;
  return t40 * 256 + mpCrc8(mpBytes40(t40));
}}
function mpPaintClock(ctx, t, frame) {{
  ctx.fillStyle = '#808080';
  ctx.fillRect(0, 0, MP.W, MP.H);
  const word = mpWord(t);
  const block = (i, y, on) => {{
    ctx.fillStyle = on ? '#ffffff' : '#000000';
    ctx.fillRect(MP.X0 + i * MP.BW, y, MP.BW, MP.BH);
  }};
  for (let i = 0; i < MP.N; i++) block(i, MP.ROWS[0], i % 2 === 0);
  for (let i = 0; i < 2 * MP.N; i++) {{
    block(i % MP.N, MP.ROWS[1 + Math.floor(i / MP.N)], Math.floor(word / 2 ** (47 - i)) % 2 === 1);
  }}
  ctx.fillStyle = '#000000';
  ctx.font = 'bold 36px monospace';
  ctx.fillText(String(t), MP.X0, 250);
  ctx.fillText('frame ' + frame, MP.X0, 300);
  ctx.fillRect((frame * 8) % MP.W, 320, 40, 30);  // some motion
}}
function mpBlockMean(data, i, y) {{  // mean luma of the block's centre half
  const x0 = MP.X0 + i * MP.BW + MP.BW / 4, y0 = y + MP.BH / 4;
  let sum = 0, n = 0;
  for (let yy = y0; yy < y0 + MP.BH / 2; yy++) {{
    for (let xx = x0; xx < x0 + MP.BW / 2; xx++) {{
      const o = (yy * MP.W + xx) * 4;
      sum += data[o] + data[o + 1] + data[o + 2];
      n += 3;
    }}
  }}
  return sum / n;
}}
// The time painted in a 640x360 RGBA frame, or null when the code does not read back validly.
function mpDecodeClock(data, now) {{
  const ref = [];
  for (let i = 0; i < MP.N; i++) ref.push(mpBlockMean(data, i, MP.ROWS[0]));
  const white = ref.filter((_, i) => i % 2 === 0), black = ref.filter((_, i) => i % 2 === 1);
  const thr = (Math.min(...white) + Math.max(...black)) / 2;
  if (Math.min(...white) - Math.max(...black) < 60) return null;
  let word = 0;
  for (let i = 0; i < 2 * MP.N; i++) {{
    const bit = mpBlockMean(data, i % MP.N, MP.ROWS[1 + Math.floor(i / MP.N)]) > thr ? 1 : 0;
    word = word * 2 + bit;
  }}
  const t40 = Math.floor(word / 256), crc = word % 256;
  if (mpCrc8(mpBytes40(t40)) !== crc) return null;
  const d = ((now % MP.PERIOD) - t40 + MP.PERIOD) % MP.PERIOD;
  return now - d;
}}
function mpGathered(pc, ms) {{  // resolves true once ICE gathering is complete, false after ms
  if (pc.iceGatheringState === 'complete') return Promise.resolve(true);
  return new Promise(resolve => {{
    const timer = setTimeout(() => resolve(false), ms);
    pc.addEventListener('icegatheringstatechange', () => {{
      if (pc.iceGatheringState === 'complete') {{ clearTimeout(timer); resolve(true); }}
    }});
  }});
}}
function mpPreferH264(transceiver) {{
  const caps = RTCRtpReceiver.getCapabilities('video').codecs;
  const h264 = caps.filter(c => c.mimeType.toLowerCase() === 'video/h264');
  const rank = c => ((c.sdpFmtpLine || '').includes('packetization-mode=1') ? 0 : 10)
    + ((c.sdpFmtpLine || '').includes('profile-level-id=42e0') ? 0 : 1);
  h264.sort((a, b) => rank(a) - rank(b));
  const rtx = caps.filter(c => c.mimeType.toLowerCase() === 'video/rtx');
  transceiver.setCodecPreferences([...h264, ...rtx]);
}}
function mpHeaders(token, type) {{
  const h = {{}};
  if (type) h['Content-Type'] = type;
  if (token) h['Authorization'] = 'Bearer ' + token;
  return h;
}}
// Non-trickle offer/answer: gather (bounded), POST, apply the 201's answer. Returns whether it was applied.
async function mpNegotiate(pc, url, token, st, gatherMs) {{
  await pc.setLocalDescription(await pc.createOffer());
  st.gatheringComplete = await mpGathered(pc, gatherMs);
  st.offer = pc.localDescription.sdp;
  const r = await fetch(url, {{method: 'POST', headers: mpHeaders(token, 'application/sdp'), body: st.offer}});
  st.status = r.status;
  st.location = r.headers.get('Location');
  st.etag = r.headers.get('ETag');
  st.contentType = r.headers.get('Content-Type');
  const body = await r.text();
  if (r.status !== 201) {{ st.error = 'POST ' + r.status + ': ' + body.slice(0, 300); return false; }}
  st.answer = body;
  await pc.setRemoteDescription({{type: 'answer', sdp: body}});
  return true;
}}
async function mpDelete(st, token) {{
  if (!st.location) return null;
  const r = await fetch(new URL(st.location, window.location.href), {{method: 'DELETE', headers: mpHeaders(token)}});
  st.deleteStatus = r.status;
  return r.status;
}}
function mpWatch(pc, st) {{
  const update = () => {{
    st.connectionState = pc.connectionState;
    st.iceConnectionState = pc.iceConnectionState;
    if (['disconnected', 'failed', 'closed'].includes(pc.connectionState) && !st.stopped) st.ended = true;
    if (pc.connectionState === 'connected' && st.connectedAt === null) st.connectedAt = Date.now() - st.startedAt;
  }};
  pc.addEventListener('connectionstatechange', update);
  pc.addEventListener('iceconnectionstatechange', update);
  pc.addEventListener('icegatheringstatechange', () => {{ st.iceGatheringState = pc.iceGatheringState; }});
}}
async function mpStats(pc, st) {{  // codecs, counters, candidates and the selected pair, into st
  const stats = await pc.getStats();
  const local = [], remote = [];
  stats.forEach(r => {{
    const codec = r.codecId ? stats.get(r.codecId) : null;
    const name = codec ? codec.mimeType + (codec.sdpFmtpLine ? ' ' + codec.sdpFmtpLine : '') : null;
    if (r.type === 'outbound-rtp') {{
      st[r.kind + 'Codec'] = name;
      st[r.kind + 'PacketsSent'] = r.packetsSent || 0;
      if (r.kind === 'video') {{ st.framesSent = r.framesSent || 0; st.framesEncoded = r.framesEncoded || 0;
        st.encoder = r.encoderImplementation || null; st.frameWidth = r.frameWidth || 0; }}
    }} else if (r.type === 'inbound-rtp') {{
      st[r.kind + 'Codec'] = name;
      st[r.kind + 'PacketsReceived'] = r.packetsReceived || 0;
      if (r.kind === 'video') {{
        st.framesDecoded = r.framesDecoded || 0;
        st.decoder = r.decoderImplementation || null;
      }}
    }} else if (r.type === 'local-candidate' || r.type === 'remote-candidate') {{
      (r.type === 'local-candidate' ? local : remote).push(
        `${{r.candidateType}} ${{r.protocol}} ${{r.address || r.ip}}:${{r.port}}`);
    }} else if (r.type === 'transport' && r.selectedCandidatePairId) {{
      const pair = stats.get(r.selectedCandidatePairId);
      if (pair) {{
        const l = stats.get(pair.localCandidateId), rr = stats.get(pair.remoteCandidateId);
        const addr = c => c ? `${{c.candidateType}} ${{c.address || c.ip}}:${{c.port}}` : '?';
        st.selectedPair = addr(l) + ' -> ' + addr(rr);
      }}
    }}
  }});
  st.localCandidates = local;
  st.remoteCandidates = remote;
}}
"""

WHIP_HTML = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>whip</title></head>
<body><canvas id="c" width="{CLOCK_W}" height="{CLOCK_H}"></canvas>
<script>
{CLOCK_JS}
window.__whip = {{status: null, location: null, etag: null, connectionState: 'new', error: null, framesSent: 0,
                 ended: false, stopped: false, connectedAt: null, startedAt: Date.now()}};
let pc = null, stream = null, painter = null, poller = null, token = null;
window.whipStart = async (cfg) => {{
  const st = window.__whip;
  token = cfg.token;
  try {{
    if (cfg.source === 'camera') {{
      stream = await navigator.mediaDevices.getUserMedia({{video: {{width: 640, height: 360}}, audio: cfg.audio}});
    }} else {{
      const canvas = document.getElementById('c');
      const ctx = canvas.getContext('2d');
      let frame = 0;
      mpPaintClock(ctx, Date.now(), frame);
      painter = setInterval(() => mpPaintClock(ctx, Date.now(), ++frame), 1000 / 30);
      stream = canvas.captureStream(30);
      const vt = stream.getVideoTracks()[0];
      if ('contentHint' in vt) vt.contentHint = 'detail';
      if (cfg.audio) {{
        const ac = new AudioContext({{sampleRate: 48000}});
        const osc = ac.createOscillator();
        osc.frequency.value = 440;
        const dest = ac.createMediaStreamDestination();
        osc.connect(dest);
        osc.start();
        ac.resume();
        stream.addTrack(dest.stream.getAudioTracks()[0]);
      }}
    }}
    pc = new RTCPeerConnection({{iceServers: [], bundlePolicy: cfg.bundlePolicy}});
    mpWatch(pc, st);
    const video = pc.addTransceiver(stream.getVideoTracks()[0], {{direction: 'sendonly', streams: [stream]}});
    mpPreferH264(video);
    const params = video.sender.getParameters();
    params.degradationPreference = 'maintain-resolution';
    await video.sender.setParameters(params).catch(() => {{}});
    for (const t of stream.getAudioTracks()) pc.addTransceiver(t, {{direction: 'sendonly', streams: [stream]}});
    if (!await mpNegotiate(pc, cfg.url, token, st, cfg.gatherMs)) return st;
    poller = setInterval(() => mpStats(pc, st).catch(e => {{ st.statsError = String(e); }}), 500);
  }} catch (e) {{
    st.error = String(e && e.stack || e);
  }}
  return st;
}};
window.whipStop = async (sendDelete) => {{
  const st = window.__whip;
  st.stopped = true;
  if (pc) await mpStats(pc, st).catch(() => {{}});
  clearInterval(painter); clearInterval(poller);
  try {{ if (sendDelete) await mpDelete(st, token); }} catch (e) {{ st.error = 'DELETE: ' + e; }}
  if (pc) pc.close();
  if (stream) stream.getTracks().forEach(t => t.stop());
  return st;
}};
</script></body></html>
"""

WHEP_HTML = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>whep</title></head>
<body><video id="v" muted autoplay playsinline></video>
<canvas id="c" width="{CLOCK_W}" height="{CLOCK_H}"></canvas>
<script>
{CLOCK_JS}
window.__whep = {{status: null, location: null, etag: null, connectionState: 'new', error: null, framesRendered: 0,
                 latencies: [], decoded: 0, undecoded: 0, videoWidth: 0, videoHeight: 0, ended: false,
                 trackEnded: false, muted: false, stopped: false, connectedAt: null, firstFrameAt: null,
                 startedAt: Date.now()}};
let pc = null, poller = null, token = null;
// Count rendered frames (and read the clock code off each) with requestVideoFrameCallback.
function mpAttachDecoder(video, st, decode) {{
  const ctx = document.getElementById('c').getContext('2d', {{willReadFrequently: true}});
  const onFrame = () => {{
    st.framesRendered++;
    st.videoWidth = video.videoWidth;
    st.videoHeight = video.videoHeight;
    if (st.firstFrameAt === null) st.firstFrameAt = Date.now() - st.startedAt;
    if (decode) {{
      ctx.drawImage(video, 0, 0, MP.W, MP.H);
      const now = Date.now();
      const t = mpDecodeClock(ctx.getImageData(0, 0, MP.W, MP.H).data, now);
      if (t === null) st.undecoded++;
      else {{ st.decoded++; st.latencies.push(now - t); if (st.latencies.length > 10000) st.latencies.shift(); }}
    }}
    video.requestVideoFrameCallback(onFrame);
  }};
  video.requestVideoFrameCallback(onFrame);
}}
window.whepStart = async (cfg) => {{
  const st = window.__whep;
  token = cfg.token;
  try {{
    const video = document.getElementById('v');
    const stream = new MediaStream();
    pc = new RTCPeerConnection({{iceServers: [], bundlePolicy: cfg.bundlePolicy}});
    mpWatch(pc, st);
    pc.addEventListener('track', e => {{
      stream.addTrack(e.track);
      e.track.addEventListener('ended', () => {{ st.trackEnded = true; if (!st.stopped) st.ended = true; }});
      e.track.addEventListener('mute', () => {{ st.muted = true; }});
      e.track.addEventListener('unmute', () => {{ st.muted = false; }});
      if (video.srcObject !== stream) {{
        video.srcObject = stream;
        video.play().catch(err => {{ st.playError = String(err); }});
      }}
    }});
    mpPreferH264(pc.addTransceiver('video', {{direction: 'recvonly'}}));
    if (cfg.audio) pc.addTransceiver('audio', {{direction: 'recvonly'}});
    mpAttachDecoder(video, st, cfg.decode);
    if (!await mpNegotiate(pc, cfg.url, token, st, cfg.gatherMs)) return st;
    poller = setInterval(() => mpStats(pc, st).catch(e => {{ st.statsError = String(e); }}), 500);
  }} catch (e) {{
    st.error = String(e && e.stack || e);
  }}
  return st;
}};
window.whepStop = async (sendDelete) => {{
  const st = window.__whep;
  st.stopped = true;
  if (pc) await mpStats(pc, st).catch(() => {{}});
  clearInterval(poller);
  try {{ if (sendDelete) await mpDelete(st, token); }} catch (e) {{ st.error = 'DELETE: ' + e; }}
  if (pc) pc.close();
  return st;
}};
</script></body></html>
"""


# --- Chromium ---------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def chromium(*, extra_args: Sequence[str] = (), ignore_https_errors: bool = False) -> Iterator[BrowserContext]:
    """Debian's headless Chromium with :data:`WEBRTC_ARGS`, as a playwright (sync API) browser context.

    Skips (fails under ``CI=true``) without Chromium. Use it, and every page of it, from one thread only.
    """
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=[*WEBRTC_ARGS, *extra_args], headless=True, timeout=WAIT_MS
        )
        try:
            context = browser.new_context(ignore_https_errors=ignore_https_errors)
            context.set_default_timeout(WAIT_MS)
            yield context
        finally:
            browser.close()


def serve_page(page: Page, base: str, path: str, html: str) -> None:
    """Serve ``html`` at ``{base}{path}`` by request interception and load it: the page has the edge's origin."""
    url = base.rstrip("/") + path
    page.route(url, lambda route: route.fulfill(status=200, content_type="text/html", body=html))
    response = page.goto(url, timeout=WAIT_MS)
    assert response is not None and response.status == 200, f"could not load {url}"


def wait_for(page: Page, js_condition: str, timeout_ms: int = WAIT_MS) -> Any:
    """Poll the JS expression ``js_condition`` in ``page`` until truthy (its value is returned), bounded.

    On timeout, fails with the page's ``__whip``/``__whep`` state and errors, without the SDPs.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"() => ({js_condition})", timeout=timeout_ms, polling=100)
    except PlaywrightTimeout:
        raise AssertionError(f"{js_condition!r} not true within {timeout_ms} ms: {page_summary(page)}") from None
    return page.evaluate(f"() => ({js_condition})")


def page_summary(page: Page) -> str:
    """The page's WHIP/WHEP state (minus SDPs and latency samples) and captured errors, as JSON, for messages."""
    state = page.evaluate(
        """() => {
        const pick = s => s && Object.fromEntries(Object.entries(s).filter(([k]) => !['offer', 'answer'].includes(k))
          .map(([k, v]) => k === 'latencies' ? [k + 'Count', v.length] : [k, v]));
        return {whip: pick(window.__whip), whep: pick(window.__whep), errors: window.__errors};
    }"""
    )
    return json.dumps(state, default=str)


def _api(base: str, flow_id: str, kind: str) -> str:
    return f"{base.rstrip('/')}/api/v1/flows/{flow_id}/{kind}"


def publish_whip(
    page: Page,
    base: str,
    flow_id: str,
    token: str | None = None,
    *,
    source: str = "clock",
    audio: bool = True,
    gather_ms: int = GATHER_MS,
    bundle_policy: str = "balanced",
) -> dict[str, Any]:
    """Load the WHIP publisher page at the edge's origin and publish to ``flow_id``.

    ``source``: ``"clock"`` (a 640x360 canvas at 30 fps painting the clock code; a 440 Hz WebAudio tone when
    ``audio``) or ``"camera"`` (Chromium's fake camera and microphone). Video is sendonly with H.264 preferred.
    ``bundle_policy`` is the RTCPeerConnection's (Chromium's default ``"balanced"``: one transport per media kind
    in the offer, which a BUNDLE answer collapses; ``"max-bundle"``: one from the start).
    Returns ``window.__whip`` once the POST is answered (and the answer applied): check ``status``/``error``, then
    ``wait_for(page, "window.__whip.connectionState === 'connected'")`` and
    ``wait_for(page, "window.__whip.framesSent > 30")``. Stop with :func:`stop_whip`.
    """
    if source not in ("clock", "camera"):
        raise ValueError(f"source must be 'clock' or 'camera', not {source!r}")
    serve_page(page, base, WHIP_PAGE, WHIP_HTML)
    cfg: dict[str, Any] = {"url": _api(base, flow_id, "whip"), "token": token, "source": source, "audio": audio}
    cfg.update(gatherMs=gather_ms, bundlePolicy=bundle_policy)
    state: dict[str, Any] = page.evaluate("cfg => window.whipStart(cfg)", cfg)
    return state


def stop_whip(page: Page, *, delete: bool = True) -> dict[str, Any]:
    """End the page's WHIP session (``DELETE`` its Location unless ``delete=False``), close it; the final state."""
    state: dict[str, Any] = page.evaluate("d => window.whipStop(d)", delete)
    return state


def view_whep(
    page: Page,
    base: str,
    flow_id: str,
    token: str | None = None,
    *,
    audio: bool = True,
    decode_clock: bool = True,
    gather_ms: int = GATHER_MS,
    bundle_policy: str = "balanced",
) -> dict[str, Any]:
    """Load the WHEP viewer page at the edge's origin and play ``flow_id`` (recvonly, H.264 preferred) muted.

    Each rendered frame counts in ``window.__whep.framesRendered``; with ``decode_clock`` the clock code is read
    off it and ``Date.now() - painted`` (ms) appended to ``latencies`` (``decoded``/``undecoded`` count frames).
    ``ended`` turns true when the connection goes disconnected/failed/closed (or the track ends) while not stopped.
    Returns the state once the POST is answered; stop with :func:`stop_whep`.
    """
    serve_page(page, base, WHEP_PAGE, WHEP_HTML)
    cfg: dict[str, Any] = {"url": _api(base, flow_id, "whep"), "token": token, "audio": audio, "decode": decode_clock}
    cfg.update(gatherMs=gather_ms, bundlePolicy=bundle_policy)
    state: dict[str, Any] = page.evaluate("cfg => window.whepStart(cfg)", cfg)
    return state


def stop_whep(page: Page, *, delete: bool = True) -> dict[str, Any]:
    """End the page's WHEP session (``DELETE`` unless ``delete=False``), close it; the final state."""
    state: dict[str, Any] = page.evaluate("d => window.whepStop(d)", delete)
    return state


def whep_state(page: Page) -> dict[str, Any]:
    """``window.__whep`` now."""
    state: dict[str, Any] = page.evaluate("() => window.__whep")
    return state


def whip_state(page: Page) -> dict[str, Any]:
    """``window.__whip`` now."""
    state: dict[str, Any] = page.evaluate("() => window.__whip")
    return state


def sdp_codecs(sdp: str, kind: str = "video") -> list[str]:
    """The ``rtpmap`` encodings of the first ``m=<kind>`` section, in the order offered (``["H264/90000", ...]``)."""
    out: list[str] = []
    in_section = False
    for line in sdp.splitlines():
        if line.startswith("m="):
            if in_section:
                break
            in_section = line.startswith(f"m={kind} ")
        elif in_section and line.startswith("a=rtpmap:"):
            out.append(line.split(" ", 1)[1])
    return out


# --- the clock code in Python -------------------------------------------------------------------------------------
def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def decode_clock(rgb: np.ndarray, now_ms: int | None = None) -> int | None:
    """The ``Date.now()`` painted in a decoded frame (``rgb``: H x W x 3 uint8, any size), or None when the code
    does not read back (no contrast in the reference row, or a CRC mismatch). Mirrors the pages' ``mpDecodeClock``."""
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    h, w = rgb.shape[:2]
    sx, sy = w / CLOCK_W, h / CLOCK_H

    def mean(i: int, y: int) -> float:
        x0 = CLOCK_X0 + i * CLOCK_BW + CLOCK_BW // 4
        y0 = y + CLOCK_BH // 4
        patch = rgb[int(y0 * sy) : int((y0 + CLOCK_BH // 2) * sy), int(x0 * sx) : int((x0 + CLOCK_BW // 2) * sx)]
        return float(patch.mean()) if patch.size else 0.0

    ref = [mean(i, CLOCK_ROWS[0]) for i in range(CLOCK_BLOCKS)]
    white, black = min(ref[0::2]), max(ref[1::2])
    if white - black < 60:
        return None
    threshold = (white + black) / 2
    word = 0
    for i in range(2 * CLOCK_BLOCKS):
        word = word * 2 + (mean(i % CLOCK_BLOCKS, CLOCK_ROWS[1 + i // CLOCK_BLOCKS]) > threshold)
    t40, crc = word >> 8, word & 0xFF
    if _crc8(t40.to_bytes(5, "big")) != crc:
        return None
    return now_ms - (now_ms - t40) % CLOCK_PERIOD


# --- aiortc clients (asyncio; sync entry points for trio.to_thread.run_sync) ----------------------------------------
def allow_aioice_loopback() -> None:
    """Make aioice gather a 127.0.0.1 host candidate too (it skips loopback): for hosts or namespaces whose only
    IPv4 address is loopback. Process-wide and idempotent."""
    import aioice.ice

    original = aioice.ice.get_host_addresses
    if getattr(original, "_mp_loopback", False):
        return

    def with_loopback(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        addresses = original(use_ipv4, use_ipv6)
        return [*addresses, "127.0.0.1"] if use_ipv4 and "127.0.0.1" not in addresses else addresses

    with_loopback._mp_loopback = True  # type: ignore[attr-defined]
    aioice.ice.get_host_addresses = with_loopback


def post_sdp(
    base: str, path: str, body: str | bytes, *, token: str | None = None, content_type: str = "application/sdp"
) -> httpx.Response:
    """POST ``body`` to ``{base}{path}`` (for the 401/415/404 checks), bounded."""
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with httpx.Client(timeout=10.0) as client:
        return client.post(base.rstrip("/") + path, content=body, headers=headers)


def delete_session(base: str, location: str, *, token: str | None = None) -> httpx.Response:
    """``DELETE {base}{location}`` (``location`` as the 201 gave it, relative), bounded."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=10.0) as client:
        return client.delete(httpx.URL(base.rstrip("/") + "/").join(location), headers=headers)


def _peer_connection(*, max_bundle: bool, loopback: bool) -> Any:
    """An aiortc RTCPeerConnection without STUN/TURN; ``max_bundle``: one transport for every m-line from the offer
    on (aiortc's default ``balanced`` offers one per m-line); ``loopback``: :func:`allow_aioice_loopback` first."""
    from aiortc import RTCConfiguration, RTCPeerConnection
    from aiortc.rtcconfiguration import RTCBundlePolicy

    if loopback:
        allow_aioice_loopback()
    policy = RTCBundlePolicy.MAX_BUNDLE if max_bundle else RTCBundlePolicy.BALANCED
    return RTCPeerConnection(RTCConfiguration(iceServers=[], bundlePolicy=policy))


def _h264_preferences() -> list[Any]:
    from aiortc import RTCRtpReceiver

    capabilities = RTCRtpReceiver.getCapabilities("video")
    assert capabilities is not None
    caps = capabilities.codecs
    h264 = [c for c in caps if c.mimeType.lower() == "video/h264"]
    h264.sort(key=lambda c: c.parameters.get("profile-level-id", "") != "42e01f")  # constrained baseline first
    return h264 + [c for c in caps if c.mimeType.lower() == "video/rtx"]


async def _post_offer(
    pc: Any, url: str, token: str | None, result: dict[str, Any], timeout: float
) -> httpx.Response | None:
    """setLocalDescription (aiortc gathers every candidate there: non-trickle), POST it, apply a 201's answer."""
    from aiortc import RTCSessionDescription

    await asyncio.wait_for(pc.setLocalDescription(await pc.createOffer()), timeout)
    result["offer"] = pc.localDescription.sdp
    result["local_candidates"] = [line[2:] for line in result["offer"].splitlines() if line.startswith("a=candidate:")]
    headers = {"Content-Type": "application/sdp"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient(timeout=timeout) as client:
        response = await client.post(url, content=pc.localDescription.sdp, headers=headers)
    result.update(status=response.status_code, location=response.headers.get("location"))
    result.update(etag=response.headers.get("etag"), content_type=response.headers.get("content-type"))
    if response.status_code != 201:
        result["error"] = response.text[:300]
        return None
    result["answer"] = response.text
    result["video_codec"] = next(iter(sdp_codecs(response.text, "video")), None)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
    return response


async def _delete(base: str, location: str | None, token: str | None, timeout: float) -> int | None:
    if not location:
        return None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=timeout) as client:
        response = await client.delete(httpx.URL(base.rstrip("/") + "/").join(location), headers=headers)
    return response.status_code


def _blocking(
    client: Callable[..., Coroutine[Any, Any, dict[str, Any]]], slack: int, *args: Any, **options: Any
) -> dict[str, Any]:
    """Run an aiortc client coroutine to its end in a fresh asyncio loop (the sync wrappers below), bounded
    by its ``seconds`` plus ``slack`` times its ``timeout`` (each at the client's own default when not given)."""
    bound = inspect.signature(client).bind(*args, **options)
    bound.apply_defaults()
    limit = bound.arguments["seconds"] + slack * bound.arguments["timeout"]
    return asyncio.run(asyncio.wait_for(client(*bound.args, **bound.kwargs), limit))


async def whep_receive_async(
    base: str,
    flow_id: str,
    token: str | None = None,
    *,
    seconds: float = 5.0,
    min_frames: int | None = None,
    audio: bool = True,
    delete: bool = True,
    clock: bool = False,
    timeout: float = 10.0,
    max_bundle: bool = False,
    loopback: bool = False,
) -> dict[str, Any]:
    """An aiortc WHEP viewer (recvonly video, H.264 only, plus audio); see :func:`whep_receive`."""
    from aiortc.mediastreams import MediaStreamError

    url = _api(base, flow_id, "whep")
    result: dict[str, Any] = {"status": None, "location": None, "frames": 0, "width": 0, "height": 0}
    result.update(audio_frames=0, first_frame_after_s=None, ended=False, latencies=[], undecoded=0, error=None)
    pc = _peer_connection(max_bundle=max_bundle, loopback=loopback)
    states: list[str] = []

    def _state() -> None:
        states.append(pc.connectionState)

    pc.on("connectionstatechange", _state)
    video = pc.addTransceiver("video", direction="recvonly")
    video.setCodecPreferences(_h264_preferences())
    audio_tr = pc.addTransceiver("audio", direction="recvonly") if audio else None
    audio_task: asyncio.Task[None] | None = None
    start = time.monotonic()
    try:
        if await _post_offer(pc, url, token, result, timeout) is None:
            return result
        if audio_tr is not None:
            audio_track = audio_tr.receiver.track

            async def count_audio() -> None:
                with contextlib.suppress(MediaStreamError):
                    while True:
                        await audio_track.recv()
                        result["audio_frames"] += 1

            audio_task = asyncio.create_task(count_audio())
        track = video.receiver.track
        deadline = start + seconds
        while (now := time.monotonic()) < deadline and (min_frames is None or result["frames"] < min_frames):
            if pc.connectionState in ("failed", "closed"):
                result["ended"] = True
                break
            try:
                frame = await asyncio.wait_for(track.recv(), min(0.5, deadline - now))
            except TimeoutError:
                continue
            except MediaStreamError:
                result["ended"] = True
                break
            if result["frames"] == 0:
                result["first_frame_after_s"] = round(time.monotonic() - start, 3)
            result["frames"] += 1
            result["width"], result["height"] = frame.width, frame.height
            if clock:
                painted = decode_clock(frame.to_ndarray(format="rgb24"))
                if painted is None:
                    result["undecoded"] += 1
                else:
                    result["latencies"].append(int(time.time() * 1000) - painted)
        result.update(connection_states=states, connected="connected" in states)
        if delete and not result["ended"]:
            result["delete_status"] = await _delete(base, result["location"], token, timeout)
    finally:
        if audio_task is not None:
            audio_task.cancel()
        await asyncio.wait_for(pc.close(), timeout)
    return result


def whep_receive(base: str, flow_id: str, token: str | None = None, **options: Any) -> dict[str, Any]:
    """Receive ``flow_id`` over WHEP with aiortc, decoding video frames for up to ``seconds`` (from the POST), or
    until ``min_frames`` came, or the track/connection ended; then ``DELETE`` the session (unless ``delete=False``
    or it ended). Blocking (``asyncio.run``): from trio, ``await trio.to_thread.run_sync(lambda: whep_receive(...))``.

    Returns ``status``, ``location``, ``etag``, ``frames``, ``width``, ``height``, ``audio_frames``,
    ``first_frame_after_s``, ``ended``, ``connected``, ``local_candidates``, ``video_codec`` (the answer's first
    video rtpmap), ``connection_states``, ``delete_status``, ``offer``/``answer`` and, with ``clock``,
    ``latencies`` (ms) and ``undecoded``.
    ``max_bundle``/``loopback``: see ``_peer_connection`` (``loopback`` where 127.0.0.1 is the host's only IPv4).
    """
    return _blocking(whep_receive_async, 3, base, flow_id, token, **options)


async def whip_send_file_async(
    base: str,
    flow_id: str,
    token: str | None = None,
    *,
    source_path: str,
    seconds: float = 5.0,
    audio: bool = True,
    loop: bool | None = None,
    delete: bool = True,
    timeout: float = 10.0,
    media_format: str | None = None,
    media_options: dict[str, str] | None = None,
    max_bundle: bool = False,
    loopback: bool = False,
) -> dict[str, Any]:
    """An aiortc WHIP publisher from a media file; see :func:`whip_send_file`."""
    from aiortc.contrib.media import MediaPlayer

    url = _api(base, flow_id, "whip")
    result: dict[str, Any] = {"status": None, "location": None, "connected": False, "ended": False, "error": None}
    if loop is None:  # a file loops (so `seconds` may outlast it); a live lavfi/device source cannot seek
        loop = media_format is None
    player = MediaPlayer(source_path, format=media_format, options=media_options or {}, loop=loop)
    pc = _peer_connection(max_bundle=max_bundle, loopback=loopback)
    states: list[str] = []
    connected, gone = asyncio.Event(), asyncio.Event()

    def _state() -> None:
        states.append(pc.connectionState)
        if pc.connectionState == "connected":
            connected.set()
        elif pc.connectionState in ("failed", "closed"):
            gone.set()

    pc.on("connectionstatechange", _state)

    try:
        if player.video is None:
            raise ValueError(f"{source_path} has no video")
        video = pc.addTransceiver(player.video, direction="sendonly")
        video.setCodecPreferences(_h264_preferences())
        if audio and player.audio is not None:
            pc.addTransceiver(player.audio, direction="sendonly")
        start = time.monotonic()
        if await _post_offer(pc, url, token, result, timeout) is None:
            return result
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(connected.wait(), timeout)
        result["connected"] = connected.is_set()
        result["connected_after_s"] = round(time.monotonic() - start, 3) if connected.is_set() else None
        if connected.is_set():  # the media flows for `seconds`, unless the connection fails or closes first
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone.wait(), seconds)
            result["ended"] = gone.is_set()
        stats = await pc.getStats()
        for report in stats.values():
            if report.type == "outbound-rtp":
                result[f"{report.kind}_packets_sent"] = report.packetsSent
                result[f"{report.kind}_bytes_sent"] = report.bytesSent
        result["connection_states"] = states
        if delete and not result["ended"]:
            result["delete_status"] = await _delete(base, result["location"], token, timeout)
    finally:
        for track in (player.video, player.audio):
            if track is not None:
                track.stop()
        await asyncio.wait_for(pc.close(), timeout)
    return result


def whip_send_file(base: str, flow_id: str, token: str | None = None, **options: Any) -> dict[str, Any]:
    """Publish ``source_path`` (any file FFmpeg reads: mp4, ts...; or e.g. ``"testsrc=size=640x360:rate=30"`` with
    ``media_format="lavfi"``; ``loop`` defaults to looping files only) to ``flow_id`` over WHIP with aiortc for
    ``seconds`` after connecting: video re-encoded to H.264 (the only codec offered), audio to Opus. Then
    ``DELETE`` (unless ``delete=False`` or it ended). Blocking (``asyncio.run``): from trio, use
    ``trio.to_thread.run_sync``.

    Returns ``status``, ``location``, ``etag``, ``connected``, ``connected_after_s``, ``ended``, ``video_codec``,
    ``video_packets_sent``/``audio_packets_sent`` (and ``*_bytes_sent``), ``connection_states``, ``delete_status``.
    ``max_bundle``/``loopback``: as for :func:`whep_receive`.
    """
    return _blocking(whip_send_file_async, 4, base, flow_id, token, **options)
