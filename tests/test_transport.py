"""The ServerApp's own push/pull loop (``nodes.exchange``): replies are collected
as they arrive, not on Flower's fixed 3 s beat; a timeout ends the wait; a message the
SuperLink refused (no id) is not waited for."""

from __future__ import annotations

import time
from collections.abc import Iterable

import pytest
from flwr.app import Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedreg_app import nodes, server_app
from fedreg_app.core.partition_map import PartitionMap


@pytest.fixture(autouse=True)
def task_identity() -> None:
    """Messages are made inside a ServerApp task; give this process one."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


class SlowGrid:
    """Each message is answered ``delay`` seconds after it was pushed (None: never);
    ``refuse`` lists the indices whose push fails (Flower returns no id for them)."""

    def __init__(self, delays: list[float | None], refuse: Iterable[int] = ()) -> None:
        self.delays, self.refuse = delays, set(refuse)
        self.due: dict[str, tuple[float, Message]] = {}
        self.pulls = 0

    def push_messages(self, messages: Iterable[Message]) -> list[str | None]:
        ids: list[str | None] = []
        now = time.monotonic()
        for index, (msg, delay) in enumerate(zip(messages, self.delays, strict=True)):
            if index in self.refuse:
                ids.append(None)
                continue
            msg.metadata.__dict__["_message_id"] = msg.object_id
            ids.append(msg.metadata.message_id)
            if delay is not None:
                self.due[msg.metadata.message_id] = (
                    now + delay,
                    Message(RecordDict(), reply_to=msg),
                )
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        self.pulls += 1
        now = time.monotonic()
        ready = [i for i in message_ids if i in self.due and self.due[i][0] <= now]
        return [self.due.pop(i)[1] for i in ready]


def messages(count: int) -> list[Message]:
    return [Message(RecordDict(), message_type=MessageType.TRAIN, dst_node_id=n + 1)
            for n in range(count)]  # fmt: skip


def test_replies_are_collected_soon_after_they_arrive() -> None:
    grid = SlowGrid([0.1, 0.3, 0.6])
    started = time.monotonic()
    replies = nodes.exchange(grid, messages(3))
    waited = time.monotonic() - started
    assert len(replies) == 3
    # The last reply is ready at 0.6 s; Flower's loop would return at 3 s or later. The
    # bound leaves a busy machine 0.8 s of scheduling slack beyond the longest pull beat.
    assert 0.6 <= waited < 0.6 + nodes.PULL_INTERVAL_S[1] + 0.8 < 3.0


def test_timeout_ends_the_wait_with_the_replies_so_far() -> None:
    grid = SlowGrid([0.05, None])
    started = time.monotonic()
    replies = nodes.exchange(grid, messages(2), timeout=0.8)
    assert len(replies) == 1
    # ended by the timeout, not by the next beat after it (plus slack for a busy machine)
    assert 0.8 <= time.monotonic() - started < 0.8 + nodes.PULL_INTERVAL_S[1] + 0.8


def test_a_refused_message_is_not_waited_for() -> None:
    grid = SlowGrid([0.05, 0.0], refuse=[1])
    assert len(nodes.exchange(grid, messages(2))) == 1


def test_polling_backs_off_while_nothing_arrives() -> None:
    grid = SlowGrid([2.0])
    nodes.exchange(grid, messages(1))
    # A fixed 50 ms beat would pull 40 times in 2 s; the back-off pulls far fewer.
    assert grid.pulls < 15


def test_run_phase_counts_the_unanswered_and_the_refused() -> None:
    grid = SlowGrid([0.0, None, 0.0], refuse=[2])
    sent = messages(3)
    partitions = PartitionMap(3, {0: 1, 1: 2, 2: 3})
    phase = server_app.run_phase("train", grid, sent, partitions, lambda reply, pid: "",
                                 timeout=0.5)  # fmt: skip
    assert len(phase.accepted) == 1
    assert sorted(f.partition for f in phase.failures) == [1, 2]
