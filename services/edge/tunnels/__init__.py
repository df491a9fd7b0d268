"""Edge IP tunnels (interop.md 2.6, 8, 9, 10).

- ``runner.py``: one tunnel's data plane (QUIC to a relay or a direct peer, payload
  encryption), run in the tunnel worker;
- ``worker.py``: the tunnel worker process, one ``TunnelRunner`` per tunnel, commands and
  reports over the engine's socketpair framing (``services.edge.engine.ipc``);
- ``supervisor.py``: ``TunnelSupervisor`` in the control process: spawns and respawns the
  worker, restarts its tunnels, answers ``state``/``counters`` for the stats snapshot.

The control process imports only the supervisor: the data plane's modules (aioquic, crypto)
are loaded in the worker alone.
"""
