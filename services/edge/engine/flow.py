"""One running flow inside an engine worker: its input loop, outputs and analysis.

A flow runs on the immutable ``FlowConfig`` it was started with; a change is a
restart (stop, then start) decided by the control process. Outputs are the one
exception: they are hot-added and hot-removed without touching the input or
the other outputs (edge interface §3).

The RTP input pipeline (interop.md 12): each leg's datagrams pass the input
filters, then the SMPTE 2022-7 merger (when ``redundancy`` is set), then the
SMPTE 2022-1 FEC decoder (when ``fec_decode`` is set; column FEC on media
port + 2, row FEC on port + 4), and what comes out is accounted (sequence
loss), analysed and fanned out. Without merge or FEC a datagram goes straight
through with its exact kernel receive time.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Final

import trio

from appliance.models.config import FlowConfig, OutputConfig, RtpInput, SrtInput, SrtOutput, UdpInput, split_host_port
from appliance.netio import BatchReceiver
from services.edge.core.analysis import FlowAnalysis
from services.edge.core.dedup import PayloadMerger
from services.edge.core.fec import FecDecoder
from services.edge.core.merge2022_7 import HitlessMerger, LegLost, LegRestored
from services.edge.core.rtp import RtpHeader, parse_rtp
from services.edge.core.seq import SequenceTracker
from services.edge.engine.srt import SrtLegRunner
from services.edge.engine.srt_io import SrtOutputDriver, legs_of, log_event, start_runners
from services.edge.engine.udp import TS_PACKET, FlowStartError, UdpOutputDriver, open_input_socket

OutputDriver = UdpOutputDriver | SrtOutputDriver

_log = logging.getLogger("mediaplane.engine")
RECV_BATCH: Final = 64
SIGNAL_TIMEOUT_S: Final = 1.0  # no datagram for this long: the input state is "waiting"
TIMER_TICK_S: Final = 0.002  # protected flows drain and judge this often (architecture.md: 1-2 ms)
MAX_BATCHES_PER_TICK: Final = 32  # per socket: bounds one tick's work (~2000 datagrams)
_RTP_FIELDS: dict[tuple[int, int], struct.Struct] = {}  # (count, slot size) -> the batch's RTP headers
_FEC: Final = 2  # kinds in the protected pump: 0 and 1 are the 2022-7 legs
_ROLE_KIND: Final = {"leg0": 0, "leg1": 1, "fec_col": _FEC, "fec_row": _FEC}
FEC_COLUMN_PORT_OFFSET: Final = 2  # SMPTE 2022-1 §7: column FEC on media port + 2
FEC_ROW_PORT_OFFSET: Final = 4  # SMPTE 2022-1 §7: row FEC on media port + 4


class TokenBucket:
    """``max_bitrate_mbps`` policing (interop.md 2.3): bytes over the rate are filtered."""

    def __init__(self, rate_mbps: float) -> None:
        self.rate_bytes_s = rate_mbps * 1e6 / 8
        # A 50 ms burst, at least a few datagrams, so jitter on a compliant stream passes.
        self.capacity = max(self.rate_bytes_s * 0.05, 8 * 1500)
        self.tokens = self.capacity
        self.last: float | None = None

    def allow(self, size: int, now: float) -> bool:
        if self.last is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate_bytes_s)
        self.last = now
        if self.tokens >= size:
            self.tokens -= size
            return True
        return False


class FlowRuntime:
    """A started flow in this worker. ``run`` binds, reports started, then pumps."""

    def __init__(self, config: FlowConfig, on_failed: Callable[[str, str], None]) -> None:
        if not isinstance(config.input, (RtpInput, UdpInput, SrtInput)):
            raise FlowStartError(f"input type {config.input.type!r} is not supported by this engine yet")
        self.config = config
        self.flow_id = config.id
        self.input_config: RtpInput | UdpInput | SrtInput = config.input
        self.is_rtp = isinstance(config.input, RtpInput)
        self.scope = trio.CancelScope()
        self.outputs: list[OutputDriver] = []
        self.analysis = FlowAnalysis(
            media_analysis=config.media_analysis,
            tr07_mode=getattr(config.input, "tr07_mode", False),
        )
        self.sequence = SequenceTracker()
        self.packets_received = 0
        self.bytes_received = 0
        self.packets_filtered = 0
        self.last_arrival = 0.0
        self.payload_format = "rtp_ts" if self.is_rtp else "raw_ts"
        self._on_failed = on_failed
        self._ssrc = int.from_bytes(os.urandom(4), "big")
        self._nursery: trio.Nursery | None = None
        self._allowed_sources: frozenset[str] | None = None
        self._source_verdicts: dict[str, bool] = {}  # sender host -> allowed, for whole batches
        self._allowed_pts: frozenset[int] | None = None
        self._bucket: TokenBucket | None = None
        self.merger: HitlessMerger | None = None
        self.decoder: FecDecoder | None = None
        self.srt_runners: list[SrtLegRunner] = []
        self.payload_merger: PayloadMerger | None = None
        if isinstance(self.input_config, SrtInput):
            legs = legs_of(self.input_config)
            self.srt_runners = [
                SrtLegRunner(
                    leg,
                    sink=self._srt_sink(i),
                    batch_end=self._finish_batch,  # send and analyse per batch, not per message
                    max_peers=1,
                    on_event=log_event(config.id, "input", i),
                )
                for i, leg in enumerate(legs)
            ]
            if len(legs) == 2:
                # Two independent connections: RTP-wrapped TS merges on the sequence number
                # (2022-7 style), raw TS on the payload. SRT legs deliver up to their latency
                # difference apart, plus jitter (measured: up to ~0.9 s on a loaded host).
                skew_s = abs(legs[0].latency_ms - legs[1].latency_ms) / 1000
                self.merger = HitlessMerger(window_s=0.5 + skew_s, leg_timeout_s=1.0 + skew_s)
                # The copies of one message can be apart by the legs' latency difference.
                self.payload_merger = PayloadMerger(window_s=1.0 + 2 * max(leg.latency_ms for leg in legs) / 1000)
        if isinstance(self.input_config, RtpInput):
            rtp = self.input_config
            if rtp.allowed_sources:
                self._allowed_sources = frozenset(ipaddress.ip_address(ip).compressed for ip in rtp.allowed_sources)
            if rtp.allowed_payload_types:
                self._allowed_pts = frozenset(rtp.allowed_payload_types)
            if rtp.max_bitrate_mbps:
                self._bucket = TokenBucket(rtp.max_bitrate_mbps)
            if rtp.redundancy is not None:
                self.merger = HitlessMerger()
            if rtp.fec_decode is not None:
                self.decoder = FecDecoder(rtp.fec_decode.columns, rtp.fec_decode.rows)
        # Kernel receive times are CLOCK_REALTIME; the analysers want one monotonic clock.
        self._realtime_offset = time.time() - time.monotonic()
        # The batch being assembled for the analyser (one call per input batch).
        self._payloads: list[memoryview] = []
        self._times: list[float] = []
        self._rtp_times: list[int | None] = []

    # ------------------------------------------------------------------ lifecycle

    def _open_sockets(self) -> list[tuple[socket.socket, str]]:
        """Every input socket with its role: ``leg0``, ``leg1``, ``fec_col``, ``fec_row``."""
        inp = self.input_config
        if isinstance(inp, SrtInput):
            return []
        plan = [(inp.bind_addr, inp.interface_addr, "leg0")]
        if isinstance(inp, RtpInput):
            if inp.redundancy is not None:
                plan.append((inp.redundancy.bind_addr, inp.redundancy.interface_addr, "leg1"))
            if inp.fec_decode is not None:
                host, port = split_host_port(inp.bind_addr)
                shown = f"[{host}]" if ":" in host else host
                for offset, role in ((FEC_COLUMN_PORT_OFFSET, "fec_col"), (FEC_ROW_PORT_OFFSET, "fec_row")):
                    if port + offset > 65535:
                        raise FlowStartError(f"FEC port {port + offset} is out of range: lower the media port")
                    plan.append((f"{shown}:{port + offset}", inp.interface_addr, role))
        sockets: list[tuple[socket.socket, str]] = []
        try:
            for addr, interface, role in plan:
                sockets.append((open_input_socket(addr, interface), role))
        except FlowStartError:
            for sock, _ in sockets:
                sock.close()
            raise
        return sockets

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the inputs and start the outputs, report started, then pump until cancelled.

        Anything that fails before ``task_status.started()`` (a bind, an SRT option libsrt
        refuses) comes out of ``nursery.start`` as a FlowStartError, so the API answers it;
        a failure after that is the flow's ``Error`` state (``on_failed``), never the worker's.
        """
        started = False
        with self.scope:
            sockets = self._open_sockets()
            try:
                for output in self.config.outputs:
                    self.outputs.append(self._open_output(output))
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    for driver in self.outputs:
                        await nursery.start(driver.serve)
                    await start_runners(self.srt_runners, nursery, "input")
                    if self.srt_runners and self.merger is not None:
                        nursery.start_soon(self._timers)
                    if self.merger is not None or self.decoder is not None:
                        if sockets:
                            nursery.start_soon(self._pump_protected, sockets)
                    else:
                        for sock, role in sockets:
                            nursery.start_soon(self._pump, sock, role)
                    task_status.started()
                    started = True
            except Exception as exc:  # the flow boundary (style §3): the flow fails, the worker runs on
                leaf = _first_leaf(exc)
                if not started:
                    raise leaf if isinstance(leaf, FlowStartError) else FlowStartError(str(leaf)) from exc
                _log.error("flow %s failed", self.flow_id, exc_info=exc)
                self._on_failed(self.flow_id, f"input failed: {leaf}")
            finally:
                for sock, _ in sockets:
                    sock.close()
                self._close_outputs()

    def _open_output(self, config: OutputConfig) -> OutputDriver:
        if isinstance(config, SrtOutput):
            return SrtOutputDriver(config, self.flow_id)
        if config.type not in ("rtp", "udp"):
            raise FlowStartError(f"output type {config.type!r} is not supported by this engine yet")
        driver = UdpOutputDriver(config, ssrc=self._ssrc)
        driver.open()
        return driver

    def stop(self) -> None:
        self.scope.cancel()

    def _close_outputs(self) -> None:
        for output in self.outputs:
            output.close()

    async def add_output(self, config: OutputConfig) -> None:
        """Hot-add: start the output and append it; the input loop picks it up on its next batch."""
        if any(o.output_id == config.id for o in self.outputs):
            raise FlowStartError(f"output {config.id!r} exists in flow {self.flow_id!r}")
        driver = self._open_output(config)
        assert self._nursery is not None
        try:
            await self._nursery.start(driver.serve)
        except BaseException:
            driver.close()
            raise
        # A new list, so an iteration in progress is not disturbed.
        self.outputs = [*self.outputs, driver]

    def remove_output(self, output_id: str) -> bool:
        """Hot-remove; False when the output is not running in this flow."""
        driver = next((o for o in self.outputs if o.output_id == output_id), None)
        if driver is None:
            return False
        self.outputs = [o for o in self.outputs if o is not driver]
        driver.close()
        return True

    # ------------------------------------------------------------------ data path

    async def _pump(self, sock: socket.socket, role: str) -> None:
        """Plain flows: drain one socket per wakeup, in bounded batches."""
        receiver = BatchReceiver(
            sock, batch=RECV_BATCH, slot_size=2048, timestamps=True, clock_offset=self._realtime_offset
        )
        handle = self._handle_rtp_batch if self.is_rtp else self._handle_udp_batch
        in_place = self._rtp_in_place if self.is_rtp else self._udp_in_place
        while True:
            await trio.lowlevel.wait_readable(sock)
            while True:
                count = receiver.recv_batch()
                if count == 0:
                    break
                if not (receiver.slotted and in_place(receiver, count)):
                    handle(receiver, count)
                self._finish_batch()
                if count == RECV_BATCH:
                    await trio.lowlevel.checkpoint()  # a full batch: let other flows run
                # Otherwise read again before going back to epoll: datagrams that arrived while
                # this batch was handled are taken now (one recvmmsg answering EAGAIN costs less
                # than a round through the scheduler).

    async def _pump_protected(self, sockets: list[tuple[socket.socket, str]]) -> None:
        """2022-7 and FEC flows: every tick, drain every socket, then feed in arrival order.

        The merger and the decoder judge a packet lost when its copy or its repair has not
        arrived within a window. Draining all legs before judging, and feeding them sorted by
        kernel receive time, means a copy waiting unread in the other leg's socket is never
        mistaken for a loss when the worker runs late (measured: with one task per leg, a
        loaded worker declared ~3x the real loss).
        """
        receivers = [
            (BatchReceiver(sock, batch=RECV_BATCH, slot_size=2048, timestamps=True), role) for sock, role in sockets
        ]
        offset = self._realtime_offset
        merger, decoder = self.merger, self.decoder
        while True:
            await trio.sleep(TIMER_TICK_S)
            now = time.monotonic()  # taken first: everything that arrived before it is queued now
            arrived: list[tuple[float, int, bytes]] = []
            for receiver, role in receivers:
                kind = _ROLE_KIND[role]
                for _ in range(MAX_BATCHES_PER_TICK):
                    count = receiver.recv_batch()
                    views, arrivals, sources = receiver.views, receiver.arrivals, receiver.sources
                    for i in range(count):
                        arrival = arrivals[i] - offset
                        view = views[i]
                        if kind == _FEC or self._admit(view, sources[i], arrival) is not None:
                            arrived.append((arrival, kind, bytes(view)))
                    if count < RECV_BATCH:
                        break
            arrived.sort(key=lambda item: item[0])
            for arrival, kind, data in arrived:
                if kind == _FEC:
                    assert decoder is not None
                    decoder.on_fec(memoryview(data), arrival)
                elif merger is not None:
                    merger.feed(kind, memoryview(data), arrival)
                else:
                    assert decoder is not None
                    decoder.on_media(memoryview(data), arrival)
            self._release(now, timers=True)
            self._finish_batch()
            self._drain_merger_events()

    def _srt_sink(self, leg: int) -> Callable[[memoryview], None]:
        def sink(message: memoryview) -> None:
            self._on_srt_message(leg, message)

        return sink

    def _on_srt_message(self, leg: int, message: memoryview) -> None:
        """One SRT message: raw TS (7 x 188) or RTP carrying TS, told apart per message."""
        arrival = time.monotonic()
        size = len(message)
        self.packets_received += 1
        self.bytes_received += size
        if size and message[0] == 0x47 and size % TS_PACKET == 0:
            self.payload_format = "raw_ts"
            if self.payload_merger is not None and not self.payload_merger.accept(leg, message, arrival):
                return
            self.last_arrival = arrival
            datagram = bytes(message)
            payload = memoryview(datagram)
            self._payloads.append(payload)
            self._times.append(arrival)
            self._rtp_times.append(None)
            for output in self.outputs:
                output.offer(None, payload, arrival)
        else:
            header = parse_rtp(message)
            if header is None or not _is_ts(header.payload_offset, header.payload_end):
                self.packets_filtered += 1  # neither raw TS nor RTP carrying whole TS packets
                return
            self.last_arrival = arrival
            self.payload_format = "rtp_ts"
            if self.merger is not None:
                self.merger.feed(leg, message, arrival)
                self._release(arrival)
            else:
                self._emit(bytes(message), arrival)

    async def _timers(self) -> None:
        """SRT redundancy over RTP: release what the merger holds once its deadlines pass."""
        while True:
            await trio.sleep(TIMER_TICK_S)
            self._release(time.monotonic(), timers=True)
            self._finish_batch()
            self._drain_merger_events()

    def _admit(self, view: memoryview, source: tuple[str, int], arrival: float) -> RtpHeader | None:
        """Count one RTP datagram and apply the input filters (interop.md 2.3, 11).

        The parsed header when the datagram passes (so it is parsed once), else None.
        """
        size = len(view)
        self.packets_received += 1
        self.bytes_received += size
        if self._allowed_sources is not None and not self._source_allowed(source[0]):
            self.packets_filtered += 1
            return None
        header = parse_rtp(view)
        if header is None or not _is_ts(header.payload_offset, header.payload_end):
            self.packets_filtered += 1  # not RTP carrying whole TS packets
            return None
        if self._allowed_pts is not None and header.payload_type not in self._allowed_pts:
            self.packets_filtered += 1
            return None
        if self._bucket is not None and not self._bucket.allow(size, arrival):
            self.packets_filtered += 1
            return None
        self.last_arrival = arrival
        return header

    def _handle_rtp_batch(self, receiver: BatchReceiver, count: int) -> None:
        """The general RTP path, packet by packet (arrivals already on the monotonic clock)."""
        views, arrivals, sources = receiver.views, receiver.arrivals, receiver.sources
        for i in range(count):
            view = views[i]
            arrival = arrivals[i]
            header = self._admit(view, sources[i], arrival)
            if header is not None:
                self._emit(bytes(view), arrival, header)

    def _rtp_in_place(self, receiver: BatchReceiver, count: int) -> bool:
        """The steady RTP batch, handled in the receive slots without a per-packet loop.

        Taken when every datagram has the same length, a 12-byte RTP v2 header (no padding,
        extension or CSRC: RFC 3550 §5.1) and whole TS packets, one SSRC, sequence numbers
        continuing the stream, and the filters pass for the whole batch. Anything else
        (including the first packet, a gap, a reorder) answers False before any counter moved,
        and the batch goes the per-packet way.
        """
        if self._bucket is not None:
            return False
        lengths = receiver.lengths
        size = lengths[0]
        if size < 12 + TS_PACKET or (size - 12) % TS_PACKET or lengths.count(size) != count:
            return False
        slot = receiver.slot_size
        buffer = receiver.buffer
        # One Struct per batch size (compiling all 64 takes ~0.2 ms in all): exactly the
        # batch's headers are read (a 64-slot Struct costs 1.6 us per call against 0.5 for 16).
        layout = _RTP_FIELDS.get((count, slot))
        if layout is None:
            layout = _RTP_FIELDS[(count, slot)] = struct.Struct("!" + f"BBHII{slot - 12}x" * (count - 1) + "BBHII")
        fields = layout.unpack_from(buffer)
        if fields[0::5].count(0x80) != count:
            return False
        ssrcs = fields[4::5]
        if ssrcs.count(ssrcs[0]) != count:
            return False
        if self._allowed_pts is not None and not all(pt & 0x7F in self._allowed_pts for pt in set(fields[1::5])):
            return False
        if self._allowed_sources is not None and not self._sources_allowed(receiver.sources):
            return False
        if not self.sequence.on_run(fields[2::5], ssrcs[0]):
            return False
        arrivals = receiver.arrivals
        self.packets_received += count
        self.bytes_received += size * count
        self.last_arrival = arrivals[-1]
        # Out first, analysis after: the analysis never adds to the packets' latency.
        self._send_slots(receiver, 12, count, size)
        self._analyse_slots(receiver, 12, count, size - 12, arrivals, list(fields[3::5]))
        return True

    def _udp_in_place(self, receiver: BatchReceiver, count: int) -> bool:
        """The steady raw-TS batch (equal lengths, whole TS packets), handled in the slots."""
        lengths = receiver.lengths
        size = lengths[0]
        if not _is_ts(0, size) or lengths.count(size) != count:
            return False
        arrivals = receiver.arrivals
        self.packets_received += count
        self.bytes_received += size * count
        self.last_arrival = arrivals[-1]
        self._send_slots(receiver, 0, count, size)
        self._analyse_slots(receiver, 0, count, size, arrivals, None)
        return True

    def _analyse_slots(
        self,
        receiver: BatchReceiver,
        header_len: int,
        count: int,
        ts_bytes: int,
        arrivals: list[float],
        rtp_times: list[int] | None,
    ) -> None:
        self.analysis.on_strided(receiver.buffer, header_len, receiver.slot_size, count, ts_bytes, arrivals, rtp_times)

    def _send_slots(self, receiver: BatchReceiver, header_len: int, count: int, size: int) -> None:
        """Every output takes the batch from the slots; one that makes its own packets gets copies."""
        buffer, slot = receiver.buffer, receiver.slot_size
        copies: list[tuple[bytes, memoryview]] | None = None
        for output in self.outputs:
            if isinstance(output, UdpOutputDriver) and (layout := output.slot_layout(header_len, size)) is not None:
                output.send_slots(buffer, layout[0], slot, layout[1], count)
                continue
            if copies is None:
                views = receiver.views
                copies = []
                for k in range(count):
                    datagram = bytes(views[k])
                    copies.append((datagram, memoryview(datagram)[header_len:]))
            arrivals = receiver.arrivals
            for k, (datagram, payload) in enumerate(copies):
                output.offer(datagram if header_len else None, payload, arrivals[k])

    def _sources_allowed(self, sources: list[tuple[str, int]]) -> bool:
        return all(self._source_allowed(host) for host, _ in set(sources))

    def _source_allowed(self, host: str) -> bool:
        """``allowed_sources`` (interop.md 2.3) for one sender, the verdict cached per host text."""
        verdict = self._source_verdicts.get(host)
        if verdict is None:
            allowed = self._allowed_sources
            assert allowed is not None
            if len(self._source_verdicts) >= 4096:
                self._source_verdicts.clear()  # a spoofed flood costs a re-check, not memory
            verdict = self._source_verdicts[host] = ipaddress.ip_address(host).compressed in allowed
        return verdict

    def _release(self, now: float, *, timers: bool = False) -> None:
        """Move packets out of the merger, through the decoder, to the outputs."""
        merger, decoder = self.merger, self.decoder
        if merger is not None:
            if timers:
                merger.handle_timer(now)
            while (packet := merger.pop_output()) is not None:
                if decoder is not None:
                    decoder.on_media(memoryview(packet), now)
                else:
                    self._emit(packet, now)
        if decoder is not None:
            if timers:
                decoder.handle_timer(now)
            while (packet := decoder.pop_output()) is not None:
                self._emit(packet, now)

    def _emit(self, datagram: bytes, arrival: float, header: RtpHeader | None = None) -> None:
        """One RTP packet of the (merged, repaired) stream: account, analyse, fan out."""
        if header is None:
            header = parse_rtp(datagram)
            if header is None:
                return
        self.sequence.on_packet(header.sequence, header.ssrc)
        payload = memoryview(datagram)[header.payload_offset : header.payload_end]
        self._payloads.append(payload)
        self._times.append(arrival)
        self._rtp_times.append(header.timestamp)
        for output in self.outputs:
            output.offer(datagram, payload, arrival)

    def _handle_udp_batch(self, receiver: BatchReceiver, count: int) -> None:
        views, arrivals = receiver.views, receiver.arrivals
        outputs = self.outputs
        payloads, times, rtp_times = self._payloads, self._times, self._rtp_times
        for i in range(count):
            view = views[i]
            size = len(view)
            self.packets_received += 1
            self.bytes_received += size
            if not _is_ts(0, size):
                self.packets_filtered += 1
                continue
            arrival = arrivals[i]
            self.last_arrival = arrival
            datagram = bytes(view)
            payload = memoryview(datagram)
            payloads.append(payload)
            times.append(arrival)
            rtp_times.append(None)
            for output in outputs:
                output.offer(None, payload, arrival)

    def _finish_batch(self) -> None:
        """Send every output's queue, then analyse what this batch emitted (latency first)."""
        for output in self.outputs:
            output.flush()
        if self._payloads:
            self.analysis.on_batch(self._payloads, self._times, self._rtp_times)
            self._payloads, self._times, self._rtp_times = [], [], []

    def _drain_merger_events(self) -> None:
        if self.merger is None:
            return
        while (event := self.merger.next_event()) is not None:
            if isinstance(event, LegLost):
                level = logging.ERROR if event.legs_up == 0 else logging.WARNING
                _log.log(
                    level, "flow %s: 2022-7 leg %d lost (%d leg(s) up)", self.flow_id, event.leg + 1, event.legs_up
                )
            elif isinstance(event, LegRestored):
                _log.info("flow %s: 2022-7 leg %d restored", self.flow_id, event.leg + 1)

    # ------------------------------------------------------------------ stats

    def counters(self, now_monotonic: float) -> dict[str, object]:
        """The compact per-flow snapshot sent to the control process."""
        receiving = self.packets_received > 0 and now_monotonic - self.last_arrival < SIGNAL_TIMEOUT_S
        snapshot = self.analysis.snapshot(now_monotonic)
        merger, decoder = self.merger, self.decoder
        fec = None
        if decoder is not None:
            c = decoder.counters
            fec = {
                "recovered": c.recovered,
                "unrecoverable": c.unrecoverable,
                "fec_received": c.fec_received,
                "fec_malformed": c.fec_malformed,
            }
        redundancy = None
        if merger is not None:
            m = merger.counters
            redundancy = {
                "legs": [{"leg": leg + 1, "received": m.received[leg], "lost": m.lost[leg]} for leg in (0, 1)],
                "switches": m.redundancy_switches,
                "lost_on_both": m.packets_lost,
            }
        input_state = "receiving" if receiving else ("listening" if self.packets_received == 0 else "waiting")
        srt_stats = [runner.stats() for runner in self.srt_runners]
        if srt_stats:
            states = [str(s["state"]) for s in srt_stats]
            input_state = "connected" if "connected" in states else states[0]
        switches = merger.counters.redundancy_switches if merger is not None else 0
        if self.payload_merger is not None:
            switches += self.payload_merger.counters.switches
            pm = self.payload_merger.counters
            redundancy = {
                **(redundancy or {}),
                "payload_merge": {"received": list(pm.received), "redundant": pm.redundant},
            }
        return {
            "input": {
                "state": input_state,
                "srt_stats": srt_stats[0] if srt_stats else None,
                "srt_leg2_stats": srt_stats[1] if len(srt_stats) > 1 else None,
                "packets_received": self.packets_received,
                "bytes_received": self.bytes_received,
                "packets_lost": self.sequence.lost,
                "packets_filtered": self.packets_filtered,
                "packets_recovered_fec": decoder.counters.recovered if decoder is not None else 0,
                "redundancy_switches": switches,
                "fec": fec,
                "redundancy": redundancy,
                "payload_format": self.payload_format,
            },
            "outputs": [output.counters() for output in self.outputs],
            "analysis": snapshot,
        }


def _first_leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _is_ts(start: int, end: int) -> bool:
    """Whole 188-byte TS packets. A bad sync byte inside is the analyser's to count (TR 101 290)."""
    length = end - start
    return length > 0 and length % TS_PACKET == 0
