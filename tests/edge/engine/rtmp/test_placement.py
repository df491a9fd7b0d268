"""Flows sharing an RTMP listener (one TCP port) are placed on one worker process."""

from __future__ import annotations

from typing import Any

from appliance.models.config import FlowConfig
from services.edge.engine.supervisor import Engine, _Worker, shared_listener


class FakeProc:
    def __init__(self) -> None:
        self.alive = True
        self.sent: list[dict[str, Any]] = []

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.sent.append(message)
        return {"ok": True}

    async def send_unanswered(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


def engine(workers: int = 3) -> tuple[Engine, list[FakeProc]]:
    eng = Engine(
        workers=workers,
        on_stats=lambda r: None,
        on_flow_failed=lambda f, e: None,
        on_workers_lost=lambda f: None,
        on_event=lambda e: None,
    )
    procs = [FakeProc() for _ in range(workers)]
    eng._workers = [_Worker(i, proc) for i, proc in enumerate(procs)]  # type: ignore[arg-type]
    return eng, procs


def flow(flow_id: str, input_: dict[str, Any]) -> FlowConfig:
    return FlowConfig.model_validate({"id": flow_id, "name": flow_id, "input": input_, "outputs": []})


def rtmp(port: int, key: str, **extra: Any) -> dict[str, Any]:
    return {"type": "rtmp", "listen_addr": f"0.0.0.0:{port}", "stream_key": key, **extra}


def udp(port: int) -> dict[str, Any]:
    return {"type": "udp", "bind_addr": f"0.0.0.0:{port}"}


def placed(eng: Engine) -> dict[str, int]:
    return dict(eng._flow_worker)


def test_the_key_is_the_rtmp_port() -> None:
    assert shared_listener(flow("a", rtmp(1935, "k"))) == ("rtmp", 1935)
    assert shared_listener(flow("b", udp(5000))) is None


async def test_flows_on_one_rtmp_listener_share_a_worker() -> None:
    eng, _ = engine()
    await eng.start_flow(flow("a", rtmp(1935, "k1")))
    await eng.start_flow(flow("u1", udp(5000)))
    await eng.start_flow(flow("u2", udp(5002)))
    await eng.start_flow(flow("b", rtmp(1935, "k2")))  # least loaded would be another worker
    await eng.start_flow(flow("c", rtmp(1936, "k3")))  # another port: least loaded
    where = placed(eng)
    assert where["a"] == where["b"]
    assert len({where["a"], where["u1"], where["u2"]}) == 3
    # the first flow leaves: a newcomer on the port still joins the one that holds the listener
    await eng.stop_flow("a")
    await eng.start_flow(flow("d", rtmp(1935, "k4")))
    assert placed(eng)["d"] == where["b"]
    # nobody left on the port: back to the least loaded
    await eng.stop_flow("b")
    await eng.stop_flow("d")
    assert "b" not in eng._flow_listener and "d" not in eng._flow_listener


async def test_a_dead_worker_is_not_chosen_for_sharing() -> None:
    eng, procs = engine(2)
    await eng.start_flow(flow("a", rtmp(1935, "k1")))
    procs[placed(eng)["a"]].alive = False
    await eng.start_flow(flow("b", rtmp(1935, "k2")))
    assert placed(eng)["b"] != placed(eng)["a"]


async def test_rtmps_start_names_the_certificate_files() -> None:
    eng, procs = engine(1)
    eng.rtmp_tls = lambda: {"cert_path": "/c.pem", "key_path": "/k.pem"}
    await eng.start_flow(flow("a", rtmp(1935, "k1", tls=True)))
    await eng.start_flow(flow("b", rtmp(1936, "k2")))
    assert procs[0].sent[0]["rtmp_tls"] == {"cert_path": "/c.pem", "key_path": "/k.pem"}
    assert "rtmp_tls" not in procs[0].sent[1]
