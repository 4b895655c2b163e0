from __future__ import annotations

from felixpy.managers.status import EndpointStatusCombiner


def statuses(c: EndpointStatusCombiner) -> list[tuple[str, str]]:
    return [(u.endpoint_id, u.status) for u in c.pop_status_updates()]


def test_worst_family_wins_and_only_changes_are_reported() -> None:
    c = EndpointStatusCombiner()
    c.on_endpoint_status(4, "workload", "wl1", "id1", "up")
    c.on_endpoint_status(6, "workload", "wl1", "id1", "up")
    assert statuses(c) == [("id1", "up")]
    c.on_endpoint_status(6, "workload", "wl1", "id1", "up")
    assert statuses(c) == []  # no change, no report
    c.on_endpoint_status(6, "workload", "wl1", "id1", "down")
    assert statuses(c) == [("id1", "down")]
    c.on_endpoint_status(4, "workload", "wl1", "id1", "error")
    assert statuses(c) == [("id1", "error")]


def test_removed_from_every_family_reports_removal() -> None:
    c = EndpointStatusCombiner()
    c.on_endpoint_status(4, "workload", "wl1", "id1", "up")
    c.on_endpoint_status(6, "workload", "wl1", "id1", "up")
    statuses(c)
    c.on_endpoint_status(4, "workload", "wl1", "id1", "")
    assert statuses(c) == []  # v6 still has it, still up
    c.on_endpoint_status(6, "workload", "wl1", "id1", "")
    assert statuses(c) == [("id1", "")]
