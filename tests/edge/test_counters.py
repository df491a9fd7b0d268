"""The one stats contract between an engine worker and the control process.

The worker builds ``FlowCounters`` with the models in ``appliance.models.stats`` and the
control process validates them with the same models: a field renamed on one side fails
here, and a report that does not fit is dropped and counted, never a 500 on GET stats.
"""

from __future__ import annotations

import json

from appliance.models.config import FlowConfig
from appliance.models.stats import (
    TR101290_METRICS,
    AnalysisCounters,
    FlowCounters,
    Tr101290Stats,
)
from services.edge.core.analysis import FlowAnalysis
from services.edge.core.ts.tr101290 import Tr101290Analyzer
from services.edge.engine.flow import FlowRuntime
from services.edge.engine.supervisor import Engine
from tests.edge.core.tsbuild import pat_section, pes_packet, pmt_section, psi_packet

FLOW = FlowConfig.model_validate(
    {
        "id": "f",
        "name": "F",
        "input": {
            "type": "rtp",
            "bind_addr": "127.0.0.1:5000",
            "fec_decode": {"columns": 5, "rows": 5},
            "redundancy": {"bind_addr": "127.0.0.1:5010"},
        },
        "outputs": [{"type": "udp", "id": "o", "name": "O", "dest_addr": "127.0.0.1:6000"}],
    }
)


def test_the_analyser_fills_exactly_the_tr101290_fields() -> None:
    counters = Tr101290Analyzer().counters(0.0)
    assert set(counters) == set(Tr101290Stats.model_fields)


def test_an_analysed_stream_validates_as_the_contract() -> None:
    analysis = FlowAnalysis(media_analysis=True)
    packets = [
        psi_packet(0, pat_section({1: 0x100})),
        psi_packet(0x100, pmt_section(1, 0x101, [(0x1B, 0x101, b"")])),
        *(pes_packet(0x101, cc) for cc in range(5)),
    ]
    payload = memoryview(b"".join(packets[:7]))
    analysis.on_batch([payload], [1.0], [None])
    typed = AnalysisCounters.model_validate(analysis.snapshot(1.5))
    assert typed.tr101290.ts_packets_analyzed == 7 and typed.media is not None


def test_a_runtime_report_survives_the_ipc_round_trip() -> None:
    runtime = FlowRuntime(FLOW, lambda flow_id, error: None)
    report = runtime.counters(0.0)
    wire = json.loads(json.dumps(report.model_dump(mode="json")))
    assert FlowCounters.model_validate(wire) == report
    assert report.input.fec is not None and report.input.redundancy is not None
    assert [leg.leg for leg in report.input.redundancy.legs] == [1, 2]
    assert report.input.state == "listening" and report.outputs == []


def test_a_report_that_does_not_fit_is_dropped_and_counted() -> None:
    engine = Engine(
        workers=1,
        on_stats=lambda flows: None,
        on_flow_failed=lambda f, e: None,
        on_workers_lost=lambda ids: None,
        on_event=lambda event: None,
    )
    good = FlowRuntime(FLOW, lambda flow_id, error: None).counters(0.0).model_dump(mode="json")
    renamed = json.loads(json.dumps(good))
    renamed["input"]["packets_recieved"] = renamed["input"].pop("packets_received")
    typed = engine._typed_reports({"good": good, "renamed": renamed, "junk": 5})
    assert list(typed) == ["good"] and engine.rejected_reports == 2


def test_the_metric_names_are_the_interface_names() -> None:
    # edge interface §4: mediaplane_edge_tr101290_<name>; then one counter of ours for each
    # indicator beyond the interface's (docs/edge.md, Metrics)
    assert sorted(TR101290_METRICS.values()) == sorted(
        [
            "ts_packets_total",
            "sync_byte_errors_total",
            "cc_errors_total",
            "pat_errors_total",
            "pmt_errors_total",
            "tei_errors_total",
            "pcr_discontinuity_errors_total",
            "pcr_accuracy_errors_total",
            # ours
            "sync_loss_total",
            "pid_errors_total",
            "crc_errors_total",
            "pcr_repetition_errors_total",
            "pts_errors_total",
            "cat_errors_total",
        ]
    )
