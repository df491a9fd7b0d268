"""What a manager ``update_config`` changes at runtime: a pure, sans-IO plan (interop.md 6).

``plan_config_change(current, new)`` compares two whole configurations and says, flow by
flow and tunnel by tunnel, what the service must do so that the running state matches
``new`` while touching as little as possible. It does no I/O and keeps no state; the
service (``EdgeService.apply_config_change``) carries the plan out with the engine.

``new`` is the configuration as it will be persisted: the caller has already merged the
infrastructure secrets the body left out (interop.md 2.7, ``merge_kept_secrets``), so a
secret that was omitted compares equal to the stored one and changes nothing.

The rules, and why:

- **Flows are matched by id.** An id only in ``current`` is *deleted* (stopped, then
  forgotten); an id only in ``new`` is *created* (started if enabled). Renaming an id is
  a delete plus a create: the id is the flow's identity for the API, the stats and events.
- **Any change outside ``outputs`` replaces the flow** (stop, then start if enabled): the
  input, ``name``, ``enabled``, ``media_analysis``, anything a future field adds. The
  engine applies a flow's input and metadata at start only, so a restart is the one way
  to make them take effect; ``enabled`` is listed here because toggling it means starting
  or stopping the flow. A replaced flow's outputs come with it (no per-output plan).
- **An outputs-only change is hot**: outputs are matched by id inside the flow; an id
  that left is *removed*, a new id is *added*, and an output whose configuration changed
  is removed and added again (the engine has no "update output"). The flow keeps
  running, so its other outputs lose nothing. Outputs are removed before they are added
  (a changed output may rebind the same source address).
- **Reordering outputs changes nothing at runtime** (the engine fans out to every
  output alike); the new order is only persisted. Such a flow counts as unchanged.
- **Everything else is unchanged** and is not touched: never stopped, never restarted.
- Comparison is by value (``model_dump``): an explicit default equals an omitted one,
  and secrets (``SecretStr``) compare by their value.
- **Tunnels** are matched by id too: added, removed or changed (any field, secrets
  included); the service starts, stops or restarts them in the tunnel worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appliance.models.config import AppConfig, FlowConfig, OutputConfig, TunnelConfig


@dataclass(frozen=True, slots=True)
class OutputChange:
    """A flow whose outputs alone changed: remove these ids, then add these outputs."""

    flow: FlowConfig  # the flow as in the new configuration
    removed: tuple[str, ...]  # output ids, in the current configuration's order
    added: tuple[OutputConfig, ...]  # in the new configuration's order

    @property
    def flow_id(self) -> str:
        return self.flow.id


@dataclass(frozen=True, slots=True)
class ConfigPlan:
    """What to do, in the order the service does it (flows in configuration order)."""

    deleted: tuple[str, ...] = ()  # flow ids only in the current configuration
    created: tuple[FlowConfig, ...] = ()  # flows only in the new configuration
    replaced: tuple[FlowConfig, ...] = ()  # new config of flows to restart (non-output change)
    output_changes: tuple[OutputChange, ...] = ()  # flows whose outputs alone changed
    unchanged: tuple[str, ...] = ()  # flow ids left alone
    tunnels_added: tuple[str, ...] = ()
    tunnels_removed: tuple[str, ...] = ()
    tunnels_changed: tuple[str, ...] = ()
    tunnels_unchanged: tuple[str, ...] = ()

    @property
    def changed_flow_ids(self) -> tuple[str, ...]:
        """The flows created, replaced or given other outputs (what validation checks first)."""
        return (
            *(flow.id for flow in self.created),
            *(flow.id for flow in self.replaced),
            *(change.flow_id for change in self.output_changes),
        )

    @property
    def is_empty(self) -> bool:
        """Nothing to do at runtime for flows or tunnels."""
        return not (
            self.deleted
            or self.created
            or self.replaced
            or self.output_changes
            or self.tunnels_added
            or self.tunnels_removed
            or self.tunnels_changed
        )


def _flow_settings(flow: FlowConfig) -> dict[str, Any]:
    return flow.model_dump(exclude={"outputs"})


def _output_change(old: FlowConfig, new: FlowConfig) -> OutputChange | None:
    old_outputs = {output.id: output.model_dump() for output in old.outputs}
    new_outputs = {output.id: output.model_dump() for output in new.outputs}
    removed = tuple(
        output.id
        for output in old.outputs
        if output.id not in new_outputs or new_outputs[output.id] != old_outputs[output.id]
    )
    added = tuple(
        output
        for output in new.outputs
        if output.id not in old_outputs or old_outputs[output.id] != new_outputs[output.id]
    )
    if not removed and not added:
        return None
    return OutputChange(flow=new, removed=removed, added=added)


def _tunnel_key(tunnel: TunnelConfig) -> str:
    return str(tunnel.id)


def plan_config_change(current: AppConfig, new: AppConfig) -> ConfigPlan:
    """The plan that takes the running state from ``current`` to ``new`` (rules: module doc)."""
    old_flows = {flow.id: flow for flow in current.flows}
    new_ids = {flow.id for flow in new.flows}

    deleted = tuple(flow.id for flow in current.flows if flow.id not in new_ids)
    created: list[FlowConfig] = []
    replaced: list[FlowConfig] = []
    output_changes: list[OutputChange] = []
    unchanged: list[str] = []
    for flow in new.flows:
        old = old_flows.get(flow.id)
        if old is None:
            created.append(flow)
        elif _flow_settings(old) != _flow_settings(flow):
            replaced.append(flow)
        elif (change := _output_change(old, flow)) is not None:
            output_changes.append(change)
        else:
            unchanged.append(flow.id)

    old_tunnels = {_tunnel_key(t): t.model_dump() for t in current.tunnels}
    new_tunnels = {_tunnel_key(t): t.model_dump() for t in new.tunnels}
    return ConfigPlan(
        deleted=deleted,
        created=tuple(created),
        replaced=tuple(replaced),
        output_changes=tuple(output_changes),
        unchanged=tuple(unchanged),
        tunnels_added=tuple(k for k in new_tunnels if k not in old_tunnels),
        tunnels_removed=tuple(k for k in old_tunnels if k not in new_tunnels),
        tunnels_changed=tuple(k for k in new_tunnels if k in old_tunnels and old_tunnels[k] != new_tunnels[k]),
        tunnels_unchanged=tuple(k for k in new_tunnels if k in old_tunnels and old_tunnels[k] == new_tunnels[k]),
    )
