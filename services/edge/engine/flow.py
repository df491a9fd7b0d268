"""One running flow inside an engine worker: the common path every input kind feeds.

A flow runs on the immutable ``FlowConfig`` it was started with; a change is a
restart (stop, then start) decided by the control process. Outputs are the one
exception: they are hot-added and hot-removed without touching the input or
the other outputs (edge interface §3).

The input's *driver* (``engine/kinds/``: one module per kind) owns its sockets or
connections and its receive loops; it hands what it receives to this class, which
keeps the one common path (interop.md 12):

    admit (count, input filters) -> [SMPTE 2022-7 merge] -> [SMPTE 2022-1 FEC decode]
        -> sequence accounting -> outputs -> analysis

Its entry points are few and shared by every driver: ``admit_rtp`` + ``on_rtp`` and
``on_fec`` (RTP datagrams), ``on_ts`` (raw TS), ``rtp_run_in_place`` /
``ts_run_in_place`` (a steady batch handled in the receive slots), ``release`` (merge
and FEC deadlines) and ``end_batch``. Without merge or FEC a datagram goes straight
through with its exact kernel receive time.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import trio

from appliance.models.config import FlowConfig, OutputConfig, RtpInput, SrtEndpoint
from appliance.models.events import Event, EventCategory, critical, info, warning
from appliance.models.stats import (
    AnalysisCounters,
    FecCounters,
    FlowCounters,
    InputCounters,
    LegCounters,
    PayloadMergeCounters,
    RedundancyCounters,
)
from appliance.netio import BatchReceiver
from services.edge.core.analysis import FlowAnalysis
from services.edge.core.dedup import PayloadMerger
from services.edge.core.fec import FecDecoder
from services.edge.core.merge2022_7 import HitlessMerger, LegLost, LegRestored
from services.edge.core.rtp import RtpHeader, parse_rtp
from services.edge.core.seq import SequenceTracker
from services.edge.engine.drain import DrainTick
from services.edge.engine.kinds import InputDriver, OutputDriver, open_input, open_output
from services.edge.engine.udp import TS_PACKET, FlowStartError

_log = logging.getLogger("mediaplane.engine")
SIGNAL_TIMEOUT_S: Final = 1.0  # no datagram for this long: the input state is "waiting"
MAX_PENDING_EVENTS: Final = 256  # per flow, between two reports (oldest dropped)
INTERNAL_EVENT_EVERY_S: Final = 60.0  # internal-error events of one flow, at most one a minute
_RTP_FIELDS: dict[tuple[int, int], struct.Struct] = {}  # (count, slot size) -> the batch's RTP headers


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


class InputFilters:
    """The ``rtp`` input's filters (interop.md 2.3, 11): ``allowed_sources``,
    ``allowed_payload_types``, ``max_bitrate_mbps``. One implementation, used by the
    per-packet path and the in-place batch path alike."""

    def __init__(self, config: RtpInput) -> None:
        self.allowed_sources = (
            frozenset(ipaddress.ip_address(ip).compressed for ip in config.allowed_sources)
            if config.allowed_sources
            else None
        )
        self.allowed_pts = frozenset(config.allowed_payload_types) if config.allowed_payload_types else None
        self.bucket = TokenBucket(config.max_bitrate_mbps) if config.max_bitrate_mbps else None
        self._source_verdicts: dict[str, bool] = {}  # sender host -> allowed

    def source_allowed(self, host: str) -> bool:
        """``allowed_sources`` for one sender, the verdict cached per host text."""
        allowed = self.allowed_sources
        if allowed is None:
            return True
        verdict = self._source_verdicts.get(host)
        if verdict is None:
            if len(self._source_verdicts) >= 4096:
                self._source_verdicts.clear()  # a spoofed flood costs a re-check, not memory
            verdict = self._source_verdicts[host] = ipaddress.ip_address(host).compressed in allowed
        return verdict

    def batch_allowed(self, sources: list[tuple[str, int]], payload_types: tuple[int, ...]) -> bool:
        """Whether a whole steady batch passes (the bucket is never decided per batch)."""
        if self.bucket is not None:
            return False
        if self.allowed_pts is not None and not all(pt & 0x7F in self.allowed_pts for pt in set(payload_types)):
            return False
        return self.allowed_sources is None or all(self.source_allowed(host) for host, _ in set(sources))


class FlowRuntime:
    """A started flow in this worker. ``run`` opens the input and outputs, reports started, then pumps."""

    def __init__(
        self, config: FlowConfig, on_failed: Callable[[str, str], None], drain_tick: DrainTick | None = None
    ) -> None:
        """``drain_tick``: the worker's (one for all its flows); None: the flow runs its own."""
        self.config = config
        self.flow_id = config.id
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
        self.payload_format = "rtp_ts" if config.input.type == "rtp" else "raw_ts"
        self.ssrc = int.from_bytes(os.urandom(4), "big")  # RTP made for a raw-TS input (RFC 3550 §8.1)
        self.filters = InputFilters(config.input) if isinstance(config.input, RtpInput) else None
        self.merger: HitlessMerger | None = None
        self.payload_merger: PayloadMerger | None = None
        self.decoder: FecDecoder | None = None
        self.pending_events: deque[Event] = deque(maxlen=MAX_PENDING_EVENTS)
        self.internal_errors = 0
        self._internal_event_at: float | None = None
        self._analysis_errors_seen = 0
        self._on_failed = on_failed
        self._nursery: trio.Nursery | None = None
        self._own_tick = drain_tick is None
        self.drain_tick = drain_tick if drain_tick is not None else DrainTick()
        self._setup_protection()
        self.input: InputDriver = open_input(config.input, self)
        # Kernel receive times are CLOCK_REALTIME; the analysers want one monotonic clock.
        self.realtime_offset = time.time() - time.monotonic()
        # The batch being assembled for the analyser (one call per input batch).
        self._payloads: list[memoryview] = []
        self._times: list[float] = []
        self._rtp_times: list[int | None] = []

    def _setup_protection(self) -> None:
        """The merger and the decoder the input's config asks for (interop.md 12)."""
        inp = self.config.input
        if isinstance(inp, RtpInput):
            if inp.redundancy is not None:
                self.merger = HitlessMerger()
            if inp.fec_decode is not None:
                self.decoder = FecDecoder(inp.fec_decode.columns, inp.fec_decode.rows)
        elif isinstance(inp, SrtEndpoint) and inp.redundancy is not None:
            # Two independent connections: RTP-wrapped TS merges on the sequence number
            # (2022-7 style), raw TS on the payload. SRT legs deliver up to their latency
            # difference apart, plus jitter (measured: up to ~0.9 s on a loaded host).
            legs = (inp.latency_ms, inp.redundancy.latency_ms)
            skew_s = abs(legs[0] - legs[1]) / 1000
            self.merger = HitlessMerger(window_s=0.5 + skew_s, leg_timeout_s=1.0 + skew_s)
            self.payload_merger = PayloadMerger(window_s=1.0 + 2 * max(legs) / 1000)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the input and the outputs, report started, then pump until cancelled.

        Anything that fails before ``task_status.started()`` (a bind, an SRT option libsrt
        refuses) comes out of ``nursery.start`` as a FlowStartError, so the API answers it;
        a failure after that is the flow's ``Error`` state (``on_failed``), never the worker's.
        """
        started = False
        with self.scope:
            try:
                self.input.open()
                for output_config in self.config.outputs:
                    self.outputs.append(open_output(output_config, self))
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    if self._own_tick:
                        nursery.start_soon(self.drain_tick.run)
                    for driver in self.outputs:
                        await nursery.start(driver.serve)
                    await nursery.start(self.input.serve)
                    task_status.started()
                    started = True
            except Exception as exc:  # the flow boundary (style §3): the flow fails, the worker runs on
                leaf = _first_leaf(exc)
                if not started:
                    raise leaf if isinstance(leaf, FlowStartError) else FlowStartError(str(leaf)) from exc
                self.internal_error("input failed", exc)
                self._on_failed(self.flow_id, f"input failed: {leaf}")
            finally:
                self.input.close()
                for driver in self.outputs:
                    driver.close()

    def stop(self) -> None:
        self.scope.cancel()

    def internal_error(self, where: str, exc: BaseException, count: int = 1) -> None:
        """A broad catch is never silent: the first one of a flow is logged with its traceback,
        every one is counted, and an event says so (the first at once, then at most one a
        minute with the count, so a fault at packet rate cannot flood the bus)."""
        self.internal_errors += count
        if self.internal_errors == count:
            _log.error("flow %s: %s", self.flow_id, where, exc_info=exc)
        else:
            _log.debug("flow %s: %s again (%d)", self.flow_id, where, self.internal_errors, exc_info=exc)
        now = time.monotonic()
        if self._internal_event_at is not None and now - self._internal_event_at < INTERNAL_EVENT_EVERY_S:
            return
        self._internal_event_at = now
        self.publish(
            critical(
                EventCategory.FLOW,
                f"internal error: {where}",
                flow_id=self.flow_id,
                error=type(exc).__name__,
                count=self.internal_errors,
            )
        )

    def publish(self, event: Event) -> None:
        """Queue an event for the next report (the worker sends it to the control process)."""
        self.pending_events.append(event)

    async def add_output(self, config: OutputConfig) -> None:
        """Hot-add: start the output and append it; the input picks it up on its next batch."""
        if any(o.output_id == config.id for o in self.outputs):
            raise FlowStartError(f"output {config.id!r} exists in flow {self.flow_id!r}")
        driver = open_output(config, self)
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

    # ------------------------------------------------------------------ the common path

    def admit_rtp(self, view: memoryview, source: tuple[str, int] | None, arrival: float) -> RtpHeader | None:
        """Count one RTP datagram and apply the input filters (interop.md 2.3, 11).

        The parsed header when the datagram passes (so it is parsed once), else None.
        """
        size = len(view)
        self.packets_received += 1
        self.bytes_received += size
        filters = self.filters
        if filters is not None and source is not None and not filters.source_allowed(source[0]):
            self.packets_filtered += 1
            return None
        header = parse_rtp(view)
        if header is None or not is_ts(header.payload_offset, header.payload_end):
            self.packets_filtered += 1  # not RTP carrying whole TS packets
            return None
        if filters is not None:
            if filters.allowed_pts is not None and header.payload_type not in filters.allowed_pts:
                self.packets_filtered += 1
                return None
            if filters.bucket is not None and not filters.bucket.allow(size, arrival):
                self.packets_filtered += 1
                return None
        self.last_arrival = arrival
        self.payload_format = "rtp_ts"
        return header

    @property
    def protected(self) -> bool:
        """Whether 2022-7 merging or FEC decoding is on (the input then drains on a timer)."""
        return self.merger is not None or self.decoder is not None

    def on_rtp(self, leg: int, view: memoryview, arrival: float, header: RtpHeader | None) -> None:
        """An admitted RTP datagram of ``leg`` (0, or 1 for the redundant leg): merge, repair, emit.

        ``header`` is the one ``admit_rtp`` parsed (None: parsed again where needed)."""
        if self.merger is not None:
            self.merger.feed(leg, view, arrival)
            if self.decoder is None:
                self._release_merged(arrival)
        elif self.decoder is not None:
            self.decoder.on_media(view, arrival)
        else:
            self._emit(bytes(view), arrival, header)

    def on_fec(self, view: memoryview, arrival: float) -> None:
        """A SMPTE 2022-1 FEC packet (column or row port)."""
        if self.decoder is not None:
            self.decoder.on_fec(view, arrival)

    def on_ts(self, leg: int, view: memoryview, arrival: float) -> None:
        """Raw TS (a ``udp`` datagram, an SRT message without RTP): count, merge legs, emit."""
        size = len(view)
        self.packets_received += 1
        self.bytes_received += size
        if not is_ts(0, size):
            self.packets_filtered += 1  # not whole TS packets
            return
        self.payload_format = "raw_ts"
        if self.payload_merger is not None and not self.payload_merger.accept(leg, view, arrival):
            return
        self.last_arrival = arrival
        payload = memoryview(bytes(view))
        self._payloads.append(payload)
        self._times.append(arrival)
        self._rtp_times.append(None)
        for output in self.outputs:
            output.offer(None, payload, arrival)

    def release(self, now: float, *, timers: bool = False) -> None:
        """Move packets out of the merger, through the decoder, to the outputs."""
        if self.merger is not None:
            self._release_merged(now, timers)
        decoder = self.decoder
        if decoder is not None:
            if timers:
                decoder.handle_timer(now)
            while (packet := decoder.pop_output()) is not None:
                self._emit(packet, now)

    def _release_merged(self, now: float, timers: bool = False) -> None:
        merger, decoder = self.merger, self.decoder
        assert merger is not None
        if timers:
            merger.handle_timer(now)
        while (packet := merger.pop_output()) is not None:
            if decoder is not None:
                decoder.on_media(memoryview(packet), now)
            else:
                self._emit(packet, now)
        while (event := merger.next_event()) is not None:
            self._on_merger_event(event)

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

    def end_batch(self) -> None:
        """Send every output's queue, then analyse what this batch emitted (latency first)."""
        for output in self.outputs:
            output.flush()
        if self._payloads:
            self.analysis.on_batch(self._payloads, self._times, self._rtp_times)
            self._payloads, self._times, self._rtp_times = [], [], []

    def _on_merger_event(self, event: LegLost | LegRestored) -> None:
        """2022-7 (or SRT dual-leg) leg lost/restored: interop.md 11 ``redundancy`` events."""
        if isinstance(event, LegLost):
            if event.legs_up == 0:
                self.publish(
                    critical(EventCategory.REDUNDANCY, "both legs lost", flow_id=self.flow_id, leg=event.leg + 1)
                )
            else:
                self.publish(
                    warning(
                        EventCategory.REDUNDANCY,
                        f"leg {event.leg + 1} lost",
                        flow_id=self.flow_id,
                        leg=event.leg + 1,
                        legs_up=event.legs_up,
                    )
                )
        else:
            self.publish(
                info(EventCategory.REDUNDANCY, f"leg {event.leg + 1} restored", flow_id=self.flow_id, leg=event.leg + 1)
            )

    # ------------------------------------------------------------------ steady batches, in place

    def rtp_run_in_place(self, receiver: BatchReceiver, count: int) -> bool:
        """The steady RTP batch, handled in the receive slots without a per-packet loop.

        Taken when every datagram has the same length, a 12-byte RTP v2 header (no padding,
        extension or CSRC: RFC 3550 §5.1) and whole TS packets, one SSRC, sequence numbers
        continuing the stream, and the filters pass for the whole batch. Anything else
        (including the first packet, a gap, a reorder) answers False before any counter moved,
        and the batch goes the per-packet way.
        """
        lengths = receiver.lengths
        size = lengths[0]
        if size < 12 + TS_PACKET or (size - 12) % TS_PACKET or lengths.count(size) != count:
            return False
        slot = receiver.slot_size
        # One Struct per batch size (compiling all 64 takes ~0.2 ms in all): exactly the
        # batch's headers are read (a 64-slot Struct costs 1.6 us per call against 0.5 for 16).
        layout = _RTP_FIELDS.get((count, slot))
        if layout is None:
            layout = _RTP_FIELDS[(count, slot)] = struct.Struct("!" + f"BBHII{slot - 12}x" * (count - 1) + "BBHII")
        fields = layout.unpack_from(receiver.buffer)
        if fields[0::5].count(0x80) != count:
            return False
        ssrcs = fields[4::5]
        if ssrcs.count(ssrcs[0]) != count:
            return False
        filters = self.filters
        if filters is not None and not filters.batch_allowed(receiver.sources, fields[1::5]):
            return False
        if not self.sequence.on_run(fields[2::5], ssrcs[0]):
            return False
        arrivals = receiver.arrivals
        self.packets_received += count
        self.bytes_received += size * count
        self.last_arrival = arrivals[-1]
        self.payload_format = "rtp_ts"
        # Out first, analysis after: the analysis never adds to the packets' latency.
        self._send_slots(receiver, 12, count, size)
        self.analysis.on_strided(receiver.buffer, 12, slot, count, size - 12, arrivals, list(fields[3::5]))
        return True

    def ts_run_in_place(self, receiver: BatchReceiver, count: int) -> bool:
        """The steady raw-TS batch (equal lengths, whole TS packets), handled in the slots."""
        lengths = receiver.lengths
        size = lengths[0]
        if not is_ts(0, size) or lengths.count(size) != count:
            return False
        arrivals = receiver.arrivals
        self.packets_received += count
        self.bytes_received += size * count
        self.last_arrival = arrivals[-1]
        self._send_slots(receiver, 0, count, size)
        self.analysis.on_strided(receiver.buffer, 0, receiver.slot_size, count, size, arrivals, None)
        return True

    def _send_slots(self, receiver: BatchReceiver, header_len: int, count: int, size: int) -> None:
        """Every output takes the batch from the slots; one that makes its own packets gets copies."""
        buffer, slot = receiver.buffer, receiver.slot_size
        copies: list[tuple[bytes, memoryview]] | None = None
        for output in self.outputs:
            if (layout := output.slot_layout(header_len, size)) is not None:
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

    # ------------------------------------------------------------------ stats

    def signal_state(self, now_monotonic: float) -> str:
        """``listening`` (nothing yet), ``receiving``, or ``waiting`` (silent for SIGNAL_TIMEOUT_S)."""
        if self.packets_received == 0:
            return "listening"
        return "receiving" if now_monotonic - self.last_arrival < SIGNAL_TIMEOUT_S else "waiting"

    def counters(self, now_monotonic: float) -> FlowCounters:
        """The typed per-flow report sent to the control process (appliance.models.stats)."""
        merger, decoder, payload_merger = self.merger, self.decoder, self.payload_merger
        fec = None
        if decoder is not None:
            c = decoder.counters
            fec = FecCounters(
                recovered=c.recovered,
                unrecoverable=c.unrecoverable,
                fec_received=c.fec_received,
                fec_malformed=c.fec_malformed,
            )
        redundancy = None
        switches = 0
        if merger is not None:
            m = merger.counters
            switches = m.redundancy_switches
            redundancy = RedundancyCounters(
                legs=[LegCounters(leg=leg + 1, received=m.received[leg], lost=m.lost[leg]) for leg in (0, 1)],
                switches=m.redundancy_switches,
                lost_on_both=m.packets_lost,
            )
        if payload_merger is not None:
            pm = payload_merger.counters
            switches += pm.switches
            redundancy = (redundancy or RedundancyCounters()).model_copy(
                update={"payload_merge": PayloadMergeCounters(received=list(pm.received), redundant=pm.redundant)}
            )
        extra = self.input.extra_counters()
        # An input that takes RTP in itself (rtsp) reports the losses it saw there.
        lost_upstream = int(extra.pop("packets_lost", 0))
        inp = InputCounters(
            state=self.input.state(now_monotonic),
            packets_received=self.packets_received,
            bytes_received=self.bytes_received,
            packets_lost=self.sequence.lost + lost_upstream,
            packets_filtered=self.packets_filtered,
            packets_recovered_fec=decoder.counters.recovered if decoder is not None else 0,
            redundancy_switches=switches,
            payload_format="rtp_ts" if self.payload_format == "rtp_ts" else "raw_ts",
            fec=fec,
            redundancy=redundancy,
            **extra,
        )
        analysis = AnalysisCounters.model_validate(self.analysis.snapshot(now_monotonic))
        failed = self.analysis.internal_errors - self._analysis_errors_seen
        if failed and self.analysis.last_internal_exception is not None:
            # The analysis promises the data plane never sees a raise; what it caught shows here.
            self._analysis_errors_seen = self.analysis.internal_errors
            self.internal_error("analysis failed", self.analysis.last_internal_exception, failed)
        return FlowCounters(input=inp, outputs=[output.counters() for output in self.outputs], analysis=analysis)


def _first_leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def is_ts(start: int, end: int) -> bool:
    """Whole 188-byte TS packets. A bad sync byte inside is the analyser's to count (TR 101 290)."""
    length = end - start
    return length > 0 and length % TS_PACKET == 0
