"""/metrics of a live edge checked by Prometheus's own promtool, and the shipped monitoring files.

A real mp-edge runs a flow fed real TS over RTP, with an SRT caller output into Debian's
srt-live-transmit (so the SRT series exist), and a disabled flow. ``promtool check metrics``
may warn only on the interface's names listed in docs/edge.md; the alert rules pass
``promtool check rules`` and fire in ``promtool test rules``; every query of the Grafana
dashboard parses as PromQL and names only metrics that this edge exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from appliance.models.stats import TR101290_INDICATORS, TR101290_METRICS, FlowState, Health
from tests.helpers.edge import Edge, free_udp_port, running_edge, wait_for
from tests.helpers.media import rtp_stream, send_datagrams
from tests.helpers.srt import SLT, Slt, require

pytestmark = [pytest.mark.e2e, pytest.mark.interop]

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "docs/prometheus/alerts.yml"
DASHBOARD = ROOT / "docs/grafana/mediaplane-edge.json"
DOCS = ROOT / "docs/edge.md"
PROMTOOL = shutil.which("promtool")

# The interface's names (edge interface §4) that promtool's linter does not like; kept because
# the names are the contract. docs/edge.md, Metrics, says why for each.
SPEC_NAMES_PROMTOOL_WARNS = {
    "mediaplane_edge_flows_total": 'non-counter metrics should not have "_total" suffix',
    "mediaplane_edge_flow_input_packets_lost": 'counter metrics should have "_total" suffix',
    "mediaplane_edge_flow_input_packets_filtered": 'counter metrics should have "_total" suffix',
    "mediaplane_edge_flow_output_packets_dropped": 'counter metrics should have "_total" suffix',
    "mediaplane_edge_flow_pdv_jitter_us": "metric names should not contain abbreviated units",
    "mediaplane_edge_flow_iat_avg_us": "metric names should not contain abbreviated units",
    "mediaplane_edge_srt_rtt_ms": "metric names should not contain abbreviated units",
}


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    require(PROMTOOL, "promtool (Debian package prometheus; tools/ensure-debs.sh)")
    return subprocess.run(
        [str(PROMTOOL), *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


# --------------------------------------------------------------------------- the live edge


@dataclass
class Live:
    edge: Edge
    text: str

    def samples(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """name -> [(labels, value)] of every sample line."""
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for line in self.text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
            assert m, line
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
        return out

    def types(self) -> dict[str, str]:
        return dict(re.findall(r"^# TYPE (\S+) (\S+)$", self.text, re.M))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    require(SLT, "srt-live-transmit (srt-tools)")
    tmp = tmp_path_factory.mktemp("metrics")
    srt_port, rtp_in = free_udp_port(), free_udp_port()
    slt = Slt(
        tmp / "slt.log", f"srt://127.0.0.1:{srt_port}?mode=listener&latency=80", f"udp://127.0.0.1:{free_udp_port()}"
    )
    stop = threading.Event()

    def feed() -> None:  # real TS in RTP, 500 datagrams/s, until the module is done (60 s at most)
        seq, deadline = 0, time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            send_datagrams(("127.0.0.1", rtp_in), list(rtp_stream(50, first_seq=seq)), pps=500)
            seq += 50

    sender = threading.Thread(target=feed, daemon=True)
    try:
        with running_edge(tmp) as edge, edge.client() as api:
            flow = {
                "id": "cam1",
                "name": "Camera 1",
                "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{rtp_in}"},
                "outputs": [
                    {"type": "rtp", "id": "studio", "name": "Studio", "dest_addr": f"127.0.0.1:{free_udp_port()}"},
                    {
                        "type": "srt",
                        "id": "remote",
                        "name": "Remote",
                        "mode": "caller",
                        "local_addr": "0.0.0.0:0",
                        "remote_addr": f"127.0.0.1:{srt_port}",
                        "latency_ms": 80,
                    },
                ],
            }
            spare = {
                "id": "spare",
                "name": "Spare",
                "enabled": False,
                "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
                "outputs": [],
            }
            for body in (flow, spare):
                assert api.post("/api/v1/flows", json=body).status_code == 200
            sender.start()

            def ready() -> str | None:
                text = api.get("/metrics").text
                wanted = ("mediaplane_edge_srt_rtt_ms{", "mediaplane_edge_flow_iat_avg_us{", "media_video_info{")
                return text if all(w in text for w in wanted) else None

            wait_for(ready, timeout=20, interval=0.2)
            time.sleep(1.2)  # a full second of traffic behind the bitrates
            yield Live(edge, api.get("/metrics").text)
    finally:
        stop.set()
        if sender.is_alive():
            sender.join(5)
        slt.stop()


def test_the_live_body_is_the_exposition_format(live: Live) -> None:
    r = httpx.get(live.edge.url + "/metrics", timeout=10)
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = live.samples()
    assert samples["mediaplane_edge_flow_input_bitrate_bps"][0][1] > 0  # the flow was receiving


def test_promtool_check_metrics_warns_only_on_the_documented_spec_names(live: Live) -> None:
    result = promtool("check", "metrics", stdin=live.text)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    found = {}
    for line in problems:
        name, _, message = line.partition(" ")
        found[name] = message
    assert found == SPEC_NAMES_PROMTOOL_WARNS, "\n".join(problems)
    # ... and docs/edge.md's Metrics section names each of them with its reason.
    section = DOCS.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    for name in SPEC_NAMES_PROMTOOL_WARNS:
        assert f"`{name}`" in section.split("promtool", 1)[1], name


def test_flow_state_and_health_are_one_hot_for_every_configured_flow(live: Live) -> None:
    samples = live.samples()
    states = {(lbl["flow_id"], lbl["state"]): v for lbl, v in samples["mediaplane_edge_flow_state"]}
    assert set(states) == {(f, s.value) for f in ("cam1", "spare") for s in FlowState}
    assert {k for k, v in states.items() if v == 1} == {("cam1", "Running"), ("spare", "Idle")}
    assert set(states.values()) == {0.0, 1.0}
    health = {(lbl["flow_id"], lbl["health"]): v for lbl, v in samples["mediaplane_edge_flow_health"]}
    assert set(health) == {(f, h.value) for f in ("cam1", "spare") for h in Health}
    assert health[("spare", "Healthy")] == 1  # idle flows are Healthy (interop 11)
    assert sum(v for (f, _), v in health.items() if f == "cam1") == 1
    types = live.types()
    assert types["mediaplane_edge_flow_state"] == types["mediaplane_edge_flow_health"] == "gauge"
    # The interface's per-flow series stay for running flows only.
    for name, rows in samples.items():
        if name not in ("mediaplane_edge_flow_state", "mediaplane_edge_flow_health"):
            assert all(lbl.get("flow_id") != "spare" for lbl, _ in rows), name


def test_priority_status_and_a_counter_for_every_tr101290_indicator(live: Live) -> None:
    samples, types = live.samples(), live.types()
    for gauge in ("mediaplane_edge_tr101290_priority1_ok", "mediaplane_edge_tr101290_priority2_ok"):
        assert types[gauge] == "gauge"
        assert [(lbl, v in (0.0, 1.0)) for lbl, v in samples[gauge]] == [({"flow_id": "cam1"}, True)]
    assert set(TR101290_INDICATORS) <= set(TR101290_METRICS)  # every indicator has its counter
    for field, suffix in TR101290_METRICS.items():
        name = f"mediaplane_edge_tr101290_{suffix}"
        assert types[name] == "counter" and name.endswith("_total"), name
        assert [lbl for lbl, _ in samples[name]] == [{"flow_id": "cam1"}], field
    for new in ("sync_loss", "pid_errors", "crc_errors", "pcr_repetition_errors", "pts_errors", "cat_errors"):
        assert f"mediaplane_edge_tr101290_{new}_total" in samples


# --------------------------------------------------------------------------- PromQL names

_CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values(...)``) selects."""
    m = re.fullmatch(r"\s*label_values\((?:\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{[^}]*\})?\s*,)?[^,]*\)\s*", query)
    if m:  # label_values(metric{...}, label) or label_values(label)
        return {m.group(1)} if m.group(1) else set()
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', query)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = _CLAUSE.sub(" ", text)  # label lists
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables
    names = set()
    for token in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        if token.group(2) is None and token.group(1) not in _KEYWORDS:
            names.add(token.group(1))
    return names


def test_metric_names_of_a_query() -> None:
    q = 'sum by (instance, flow_id) (rate(a_total{x=~"$v", y="b c"}[$__rate_interval]) * 2 or b == 1) / on (z) c'
    assert metric_names(q) == {"a_total", "b", "c"}
    assert metric_names('label_values(m_state{instance=~"$instance"}, flow_id)') == {"m_state"}
    assert metric_names("label_values(instance)") == set()
    assert metric_names("sum(x) or vector(0) > 0.001") == {"x"}


def exported(name: str, live: Live, samples: dict[str, Any]) -> bool:
    """A name the edge exports: a sample name, or a histogram/summary family's series name."""
    if name in samples:
        return True
    types = live.types()
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and types.get(name.removesuffix(suffix)) in ("histogram", "summary"):
            return True
    return False


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, query) of every panel target and templating query of the dashboard."""
    board = json.loads(DASHBOARD.read_text())
    queries = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                queries.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
            walk(panel.get("panels", []))

    walk(board["panels"])
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            queries.append((f"variable {var['name']}", query))
    return queries


def test_the_grafana_dashboard_is_valid_json_with_the_promised_panels() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    titles = {p["title"] for p in board["panels"]}
    for must in ("Flow state", "Flow health", "Input bitrate", "Output bitrate", "Input packets lost"):
        assert must in titles, must
    assert {"Priority 1 errors", "Priority 2 errors", "SRT round-trip time"} <= titles
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
    # The TR 101 290 panels cover every indicator the edge counts.
    text = DASHBOARD.read_text()
    for field in TR101290_INDICATORS:
        assert f"mediaplane_edge_tr101290_{TR101290_METRICS[field]}" in text, field


def test_every_dashboard_query_names_a_metric_the_edge_exports(live: Live) -> None:
    samples = live.samples()
    queries = dashboard_queries()
    assert len(queries) > 20
    seen = set()
    for where, query in queries:
        names = metric_names(query)
        assert names, (where, query)
        for name in names:
            assert exported(name, live, samples), f"{where}: {name} is not in the edge's /metrics"
        seen |= names
    for must in ("mediaplane_edge_srt_rtt_ms", "mediaplane_edge_flow_input_packets_lost", "mediaplane_edge_flow_state"):
        assert must in seen


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses each query as the expression of a recording rule (Grafana's variables
    # replaced by what Grafana would put there).
    rules = []
    for i, (_, query) in enumerate(q for q in dashboard_queries() if not q[1].startswith("label_values")):
        expr = query.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$flow", ".*")
        assert "$" not in expr, query
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- alert rules


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_alert_rules_pass_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_waits_explains_itself_and_names_exported_metrics(live: Live) -> None:
    samples = live.samples()
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {
        "MediaplaneEdgeDown",
        "MediaplaneFlowDown",
        "MediaplaneFlowUnhealthy",
        "MediaplaneFlowNoInput",
        "MediaplaneFlowPacketLoss",
        "MediaplaneTr101290Priority1",
        "MediaplaneSrtRttHigh",
    }
    for rule in rules:
        assert rule["for"] and rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        for name in metric_names(rule["expr"]) - {"up"}:  # `up` is Prometheus's own
            assert exported(name, live, samples), f"{rule['alert']}: {name}"


EDGE = 'job="mediaplane-edge", instance="edge-1:8080"'
CAM1, CAM2 = ', flow_id="cam1"', ', flow_id="cam2"'


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{EDGE}{labels}}}", "values": values}


def firing(alert: str, severity: str, labels: str = "") -> dict[str, Any]:
    return {
        "labels": f'ALERTS{{alertname="{alert}", alertstate="firing", severity="{severity}", {EDGE}{labels}}}',
        "value": 1,
    }


# 15 s steps: the trouble starts at 30 s; by 5 min every alert has outlived its `for:`.
ALERT_TESTS: dict[str, Any] = {
    "evaluation_interval": "15s",
    "tests": [
        {
            "interval": "15s",
            "input_series": [
                series("up", "", "1 1 0x6"),
                series("mediaplane_edge_flow_state", CAM1 + ', state="Running"', "1x12"),
                series("mediaplane_edge_flow_state", CAM2 + ', state="Error"', "0 0 1x10"),
                series("mediaplane_edge_flow_health", CAM2 + ', health="Critical"', "0 0 1x10"),
                series("mediaplane_edge_flow_input_bitrate_bps", CAM1, "4000000 4000000 0x10"),
                series("mediaplane_edge_flow_input_packets_total", CAM1, "0+5000x40"),
                series("mediaplane_edge_flow_input_packets_lost", CAM1, "0+50x40"),
                series("mediaplane_edge_tr101290_priority1_ok", CAM1, "1 1 0x10"),
                series("mediaplane_edge_tr101290_priority2_ok", CAM1, "1x12"),
                series("mediaplane_edge_srt_rtt_ms", CAM1 + ', output_id="remote", leg="1"', "20 20 350x20"),
            ],
            "alert_rule_test": [
                {"eval_time": "15s", "alertname": "MediaplaneFlowDown", "exp_alerts": []},
                {"eval_time": "45s", "alertname": "MediaplaneEdgeDown", "exp_alerts": []},  # pending: for 1m
                {
                    "eval_time": "2m",
                    "alertname": "MediaplaneEdgeDown",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "critical", "job": "mediaplane-edge", "instance": "edge-1:8080"},
                            "exp_annotations": {
                                "summary": "Edge edge-1:8080 is down",
                                "description": "Prometheus has not scraped edge-1:8080/metrics for 1 minute: the"
                                " mp-edge service is stopped, the appliance is off, or the path to it is broken."
                                " Its flows cannot be observed (and probably do not run).",
                            },
                        }
                    ],
                },
                {"eval_time": "5m", "alertname": "MediaplaneTr101290Priority2", "exp_alerts": []},
            ],
            "promql_expr_test": [
                {
                    "expr": 'ALERTS{alertstate="firing"}',
                    "eval_time": "5m",
                    "exp_samples": [
                        firing("MediaplaneEdgeDown", "critical"),
                        firing("MediaplaneFlowDown", "critical", CAM2 + ', state="Error"'),
                        firing("MediaplaneFlowUnhealthy", "critical", CAM2 + ', health="Critical"'),
                        firing("MediaplaneFlowNoInput", "critical", CAM1),
                        firing("MediaplaneFlowPacketLoss", "warning", CAM1),
                        firing("MediaplaneTr101290Priority1", "critical", CAM1),
                        firing("MediaplaneSrtRttHigh", "warning", CAM1 + ', output_id="remote", leg="1"'),
                    ],
                }
            ],
        }
    ],
}


def test_the_alerts_fire_on_the_conditions_they_describe(tmp_path: Path) -> None:
    # promtool's rule unit tests: every alert fires on its condition and not before its `for:`.
    tests = tmp_path / "alerts-test.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(ALERTS)], **ALERT_TESTS}))
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
