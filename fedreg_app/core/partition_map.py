"""Which node serves which partition: one object owns the mapping.

The ServerApp learns it by asking nodes (``query`` messages) and refreshes it before each
round; the strategy reads it to sample clients and address messages. Nodes that are gone
are forgotten, a node that restarted (new id) replaces its old id, and nodes that serve a
different partitioning are retired so they are not asked again.
"""

from __future__ import annotations

from collections.abc import Iterable


class PartitionMap:
    def __init__(self, num_partitions: int, nodes: dict[int, int] | None = None) -> None:
        self.num_partitions = num_partitions
        self._nodes: dict[int, int] = dict(nodes or {})  # partition id -> node id
        self._retired: set[int] = set()
        #: Nodes whose last query brought no usable answer -> when (``time.monotonic``):
        #: they are asked again only after a while (each query starts a ClientApp).
        self.unanswered: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def available(self) -> list[int]:
        """Partitions that have a node now, in order."""
        return sorted(self._nodes)

    def node_of(self, partition_id: int) -> int | None:
        return self._nodes.get(partition_id)

    def partition_of(self, node_id: int) -> int | None:
        for partition_id, node in self._nodes.items():
            if node == node_id:
                return partition_id
        return None

    def known_nodes(self) -> set[int]:
        """Nodes already mapped or retired: they need not be asked again."""
        return set(self._nodes.values()) | self._retired

    def forget_gone(self, live_nodes: Iterable[int]) -> list[tuple[int, int]]:
        """Drop partitions whose node is no longer connected; returns (partition, node)."""
        live = set(live_nodes)
        self.unanswered = {n: t for n, t in self.unanswered.items() if n in live}
        gone = [(pid, node) for pid, node in self._nodes.items() if node not in live]
        for pid, _ in gone:
            del self._nodes[pid]
        return gone

    def assign(self, partition_id: int, node_id: int) -> int | None:
        """Map a partition to a node; returns the node it replaces (retired), if any."""
        previous = self._nodes.get(partition_id)
        if previous is not None and previous != node_id:
            self._retired.add(previous)
        self._nodes[partition_id] = node_id
        return previous if previous != node_id else None

    def retire(self, node_id: int) -> None:
        """A node serving another partitioning: never asked again."""
        self._retired.add(node_id)
