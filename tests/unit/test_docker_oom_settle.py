"""An exited container's OOM flag is given time to arrive (`docker.settled_state`): on cgroup v2
the engine may record the exit before the OOM, and a container killed at its memory limit read
as a plain SIGKILL in CI. The engine's answers here are scripted inspect results (the function
takes the inspect call): the real engine's side is `tests/integration/test_docker_backend.py`."""

from __future__ import annotations

import functools
from typing import Any

from suzumio.orchestrator.backends.docker import OOM_SETTLE_SECONDS, settled_state


def _container(code: int, *, oom: bool, memory: int = 64 << 20) -> dict[str, Any]:
    return {"State": {"ExitCode": code, "OOMKilled": oom}, "HostConfig": {"Memory": memory}}


def test_a_late_oom_flag_is_waited_for() -> None:
    answers = [_container(137, oom=False), _container(137, oom=False), _container(137, oom=True)]
    slept: list[float] = []
    state = settled_state(lambda: answers.pop(0), slept.append)
    assert state["OOMKilled"] is True
    assert len(slept) == 2


def test_a_kill_with_no_oom_is_a_kill_after_the_settle_time() -> None:
    answers = [_container(137, oom=False)] * 100
    slept: list[float] = []
    state = settled_state(lambda: answers.pop(0), slept.append)
    assert state["OOMKilled"] is False
    assert abs(sum(slept) - OOM_SETTLE_SECONDS) < 1e-6


def test_other_exits_and_unlimited_containers_are_taken_at_once() -> None:
    for container in (
        _container(0, oom=False),
        _container(3, oom=False),
        _container(137, oom=True),
        _container(137, oom=False, memory=0),
    ):
        slept: list[float] = []
        assert settled_state(functools.partial(dict, container), slept.append) == container["State"]
        assert slept == []
