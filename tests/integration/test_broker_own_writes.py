"""The tool-broker's own writes on an activation's subject (real NATS): after a conflict, what
another replica already wrote for the same call — a runner's retry that reached it first — is
found on the subject and not written twice, and a finish of a call started there is known."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import cast

from nats.aio.client import Client as NATS

from suzumio.contracts.events import ActivationOutputRecorded, ToolCallStarted
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.eventstore import EventStore
from suzumio.toolbroker.own_writes import append_own, output_in_log, started_in_log
from suzumio.toolbroker.registry import LiveActivation
from suzumio.toolbroker.state import Broker


def start(call_id: str) -> ToolCallStarted:
    digest = hashlib.sha256(b"{}").hexdigest()
    return ToolCallStarted(
        call_id=call_id, tool="file.read", arguments_digest=digest, arguments_size=2
    )


async def test_what_another_replica_wrote_for_the_same_call_is_not_written_again(
    nc: NATS, topology: Topology
) -> None:
    mine, other = EventStore(nc, topology), EventStore(nc, topology)
    broker = cast("Broker", SimpleNamespace(store=mine))  # the one part of it used here
    activation_id = new_id()
    await mine.append(activation_id, [start("c0")], 0)
    a = LiveActivation(activation_id, "s", "g", "p", version=1)  # this replica wrote v1
    # The other replica records the runner's retries of c1's start and of the output first.
    await other.append(activation_id, [start("c1")], 1)
    await other.append(activation_id, [ActivationOutputRecorded(text="done")], 2)

    # Whether this call wrote: a retry recorded elsewhere answers `recorded: false`, and is
    # not counted (metrics, spans) a second time.
    assert not await append_own(broker, a, [start("c1")], "system:toolbroker")
    output = ActivationOutputRecorded(text="done")
    assert not await append_own(broker, a, [output], "system:toolbroker")
    assert await append_own(broker, a, [start("c2")], "system:toolbroker")

    stream = await mine.load("activation", activation_id)
    types = [(e.envelope.type, getattr(e.data, "call_id", "")) for e in stream.events]
    assert types == [
        ("activation.tool_call_started", "c0"),
        ("activation.tool_call_started", "c1"),
        ("activation.output_recorded", ""),
        ("activation.tool_call_started", "c2"),
    ]


async def test_a_finish_of_a_call_started_on_another_replica_is_known(
    nc: NATS, topology: Topology
) -> None:
    store = EventStore(nc, topology)
    broker = cast("Broker", SimpleNamespace(store=store))
    activation_id = new_id()
    await store.append(activation_id, [start("c1")], 0)
    a = LiveActivation(activation_id, "s", "g", "p")  # has folded none of it yet

    assert await started_in_log(broker, a, "c1")
    assert "c1" in a.calls_started
    assert not await started_in_log(broker, a, "c2")


async def test_a_finish_reads_only_what_this_replica_has_not_folded(
    nc: NATS, topology: Topology
) -> None:
    """A sandbox finishing calls it never started must not make each finish read (and decode)
    the activation's whole subject: what the fold took in is known here already. So a start
    among the folded versions is not read again (here one the fold is made to have missed, to
    tell), and one after them is found."""
    store = EventStore(nc, topology)
    broker = cast("Broker", SimpleNamespace(store=store))
    activation_id = new_id()
    await store.append(activation_id, [start(f"c{i}") for i in range(3)], 0)
    folded = await store.head("activation", activation_id)
    a = LiveActivation(activation_id, "s", "g", "p", logged=folded.version)
    a.logged_seq = folded.seq
    a.calls_started |= {"c0", "c2"}  # c1 left out: not read again, it is not found
    await store.append(activation_id, [start("c3")], 3)  # after the fold: read

    assert not await started_in_log(broker, a, "c1")
    assert await started_in_log(broker, a, "c3")
    assert "c3" in a.calls_started


async def test_an_output_sent_again_reads_only_what_this_replica_has_not_folded(
    nc: NATS, topology: Topology
) -> None:
    """A fenced sandbox may send its output again and again (its token is good to its wall
    clock): each call must not read the activation's whole subject. An output among the
    folded versions would have been folded (here the fold is made to have missed one, to
    tell: it is not read again); one after them is found."""
    store = EventStore(nc, topology)
    broker = cast("Broker", SimpleNamespace(store=store))
    activation_id = new_id()
    await store.append(activation_id, [ActivationOutputRecorded(text="first")], 0)
    await store.append(activation_id, [start(f"c{i}") for i in range(3)], 1)
    folded = await store.head("activation", activation_id)
    a = LiveActivation(activation_id, "s", "g", "p", logged=folded.version)
    a.logged_seq = folded.seq

    assert not await output_in_log(broker, a)
    assert not a.output
    await store.append(activation_id, [ActivationOutputRecorded(text="again")], 4)
    assert await output_in_log(broker, a)
    assert a.output
