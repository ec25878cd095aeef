"""Group membership shared by both delivery paths: how fast a rebalance is noticed, and
leaving the group when stopped on purpose.

A rebalance (a replica joining or leaving) waits until every member has rejoined, and a
member hears of it only from its next heartbeat: HEARTBEAT_INTERVAL_SECONDS (kafka.tuning,
where both runtimes' consumers take it from) bounds that to one second.

With ASSEMBLER_GROUP_INSTANCE_ID set (static membership, KIP-345) aiokafka never sends
LeaveGroup, so a stopped replica would hold its partitions for the whole session timeout.
That is what a crashed replica should do (restarted within the timeout, it gets them back
without a rebalance), not one stopped on purpose (SIGTERM: scale-in, rollout): `leave_on_stop`
makes that one leave at once. aiokafka's LeaveGroup (v1) names the member id only, which the
broker accepts for a static member too.
"""

from __future__ import annotations

from typing import Any


def leave_on_stop(consumer: Any) -> None:
    """Have `consumer` (an AIOKafkaConsumer) send LeaveGroup when it stops, even as a static
    member; call right before stopping it. aiokafka skips the LeaveGroup of a member with a
    group_instance_id (GroupCoordinator._maybe_leave_group); nothing public turns that off."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is not None:
        coordinator._group_instance_id = None
