"""Flow watch: input signal and TR 101 290 alarm events, one per transition, none while a state holds."""

from __future__ import annotations

from appliance.models.events import EventCategory, Severity
from appliance.models.stats import TR101290_INDICATORS, Tr101290Stats
from services.edge.core.watch import CLEAR_AFTER_S, FlowWatch


def test_input_receiving_lost_and_restored() -> None:
    watch = FlowWatch("f")
    assert watch.update("listening", None, 0.0) == []
    [first] = watch.update("receiving", None, 0.25)
    assert (first.message, first.severity, first.category) == ("input receiving", Severity.INFO, EventCategory.FLOW)
    assert watch.update("receiving", None, 0.5) == []
    [lost] = watch.update("waiting", None, 1.5)
    assert (lost.message, lost.severity, lost.flow_id) == ("input lost", Severity.CRITICAL, "f")
    assert watch.update("waiting", None, 5.0) == []
    [back] = watch.update("receiving", None, 6.0)
    assert (back.message, back.severity) == ("input restored", Severity.INFO)


def test_a_priority_1_alarm_is_raised_once_and_cleared_after_the_window() -> None:
    watch = FlowWatch("f")
    assert watch.update("receiving", Tr101290Stats(), 0.0)[1:] == []
    [raised] = watch.update("receiving", Tr101290Stats(cc_errors=3), 1.0)
    assert raised.category is EventCategory.ANALYSIS and raised.severity is Severity.CRITICAL
    assert raised.details == {"indicator": "cc_errors", "priority": 1, "count": 3}
    # More errors while it holds: no event, but the clearing deadline moves.
    assert watch.update("receiving", Tr101290Stats(cc_errors=9), 5.0) == []
    assert watch.update("receiving", Tr101290Stats(cc_errors=9), 5.0 + CLEAR_AFTER_S - 0.1) == []
    [cleared] = watch.update("receiving", Tr101290Stats(cc_errors=9), 5.0 + CLEAR_AFTER_S)
    assert cleared.severity is Severity.INFO and "cleared" in cleared.message
    assert watch.update("receiving", Tr101290Stats(cc_errors=9), 60.0) == []
    [again] = watch.update("receiving", Tr101290Stats(cc_errors=10), 61.0)
    assert "raised" in again.message


def test_priority_2_alarms_are_warnings_and_each_indicator_is_its_own() -> None:
    watch = FlowWatch("f")
    events = watch.update("receiving", Tr101290Stats(tei_errors=1, pcr_accuracy_errors=2, pat_errors=1), 1.0)
    by_indicator = {e.details["indicator"]: e.severity for e in events if e.details}
    assert by_indicator == {
        "pat_errors": Severity.CRITICAL,
        "tei_errors": Severity.WARNING,
        "pcr_accuracy_errors": Severity.WARNING,
    }


def test_every_indicator_has_a_priority_and_a_label() -> None:
    assert {"sync_loss_count", "cc_errors", "pat_errors", "pmt_errors", "tei_errors"} <= set(TR101290_INDICATORS)
    assert all(priority in (1, 2) and label for priority, label in TR101290_INDICATORS.values())
