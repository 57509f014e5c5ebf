"""The docker backend against a real Docker engine and the real runner image (DESIGN.md §8, §13).

Nothing is faked: the engine is the machine's (installed and started by tools/docker_engine.py
when we may), the image is `suzumio-runner:latest` built by tools/runner_image.py. Without
them these tests fail with the reason; they are never skipped. Every container a test makes
carries the test's own namespace label and is removed when the test ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import uuid4

import docker  # type: ignore[import-untyped]
import pytest
import requests
import structlog
from docker.errors import NotFound  # type: ignore[import-untyped]
from tools import docker_engine, runner_image

from suzumio.contracts.runner import (
    ActivationSpec,
    AgentSpec,
    ProjectRef,
    RunnerActivationInput,
    RunnerConfig,
    SessionRef,
)
from suzumio.contracts.values import (
    Backend,
    ModelSpec,
    NetworkProfile,
    ResourceLimits,
    RuntimeProfileSpec,
)
from suzumio.orchestrator.backends import docker as docker_backend
from suzumio.orchestrator.backends import docker_settings
from suzumio.orchestrator.backends.base import Exit, Handle, LaunchError, LaunchPlan, MountPlan
from suzumio.orchestrator.backends.docker import DockerBackend, DockerSettings
from suzumio.platform.service.unix_socket import bind_unix

pytestmark = pytest.mark.timeout(300)  # a cold image build (debootstrap) is in the first test
STEP = 60.0  # no single wait below may take longer
# Not shaped like a provider key on purpose: the log redactor must not be what saves us.
SECRET = f"provider-key-{uuid4().hex}"
SLEEP = ("python3", "-c", "import time; time.sleep(30)")
LIMITS = ResourceLimits(cpus=0.5, memory_mb=256, disk_mb=512, pids=128)

MakeBackend = Callable[..., DockerBackend]


@pytest.fixture(scope="session")
def image() -> str:
    if not docker_engine.ensure_engine():
        pytest.fail(
            "no Docker engine answers and none could be installed/started here "
            "(run `python3 tools/docker_engine.py` as root; see .suzumio/dockerd.log)"
        )
    try:
        return runner_image.ensure_image()
    except runner_image.BuildError as exc:
        pytest.fail(f"the runner image could not be built: {exc}")


@pytest.fixture
def engine(image: str) -> Iterator[Any]:
    api = docker.APIClient(version="auto", timeout=STEP)
    yield api
    api.close()


@pytest.fixture
async def make_backend(image: str, engine: Any) -> AsyncIterator[MakeBackend]:
    namespace = f"test-{uuid4().hex[:10]}"
    made: list[DockerBackend] = []

    def make(
        namespace: str = namespace, installation: str | None = None, **settings: Any
    ) -> DockerBackend:
        backend = DockerBackend(
            DockerSettings(**{"image": image, **settings}), namespace, installation
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.close()
    for ns in {namespace, *(b._namespace for b in made)}:
        for c in engine.containers(all=True, filters={"label": f"io.suzumio.namespace={ns}"}):
            engine.remove_container(c["Id"], force=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_plan(
    root: Path,
    *,
    entry: tuple[str, ...] = (),
    network: NetworkProfile = NetworkProfile.EGRESS,
    mounts: tuple[MountPlan, ...] = (),
    limits: ResourceLimits = LIMITS,
    broker_socket: Path | None = None,
) -> LaunchPlan:
    ids = {k: f"{k}-{uuid4().hex[:12]}" for k in ("project", "agent", "session", "act")}
    spec = RunnerActivationInput(
        project=ProjectRef(id=ids["project"], name="docker test"),
        agent=AgentSpec(
            id=ids["agent"], role="tester", prompt="Say hi.", model=ModelSpec(name="m")
        ),
        session=SessionRef(id=ids["session"]),
        activation=ActivationSpec(id=ids["act"]),
        workspace="/somewhere/else",  # the backend must put /workspace here
        controller_url=f"http://127.0.0.1:{free_port()}",  # nobody listens there
        token="sza1.bogus.token",
        runner=RunnerConfig(max_retries=0, wall_clock_seconds=60),
    )
    env = {
        "SUZUMIO_PROJECT_ID": ids["project"],
        "SUZUMIO_ACTIVATION_ID": ids["act"],
        "SUZUMIO_MODEL_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
        "SUZUMIO_MODEL_API_KEY": SECRET,
    }
    return LaunchPlan(
        activation_id=ids["act"],
        session_id=ids["session"],
        project_id=ids["project"],
        agent_id=ids["agent"],
        attempt=1,
        input=spec,
        profile=RuntimeProfileSpec(
            backend=Backend.DOCKER, entry=entry, limits=limits, network=network
        ),
        env=env,
        secret_keys=frozenset({"SUZUMIO_MODEL_API_KEY"}),
        host_dir=root / ids["act"],
        session_dir=root / "sessions" / ids["session"],
        mounts=mounts,
        broker_socket=broker_socket,
    )


async def watch(backend: DockerBackend, handle: Handle) -> Exit:
    return await asyncio.wait_for(backend.watch(handle), STEP)


async def until_running(engine: Any, handle: Handle) -> dict[str, Any]:
    for _ in range(200):
        info: dict[str, Any] = engine.inspect_container(handle.sandbox_id)
        if info["State"]["Running"]:
            return info
        await asyncio.sleep(0.05)
    raise AssertionError(f"container never ran: {info['State']}")


def exec_in(engine: Any, container_id: str, code: str) -> tuple[int, str]:
    run = engine.exec_create(container_id, ["python3", "-c", code])
    output = engine.exec_start(run["Id"]).decode()
    return int(engine.exec_inspect(run["Id"])["ExitCode"]), output


async def test_runner_without_broker_exits_broker_unreachable(make_backend, tmp_path):
    backend = make_backend()
    plan = make_plan(tmp_path)
    handle = await backend.launch(plan)
    assert handle.backend == "docker"
    assert handle.activation_id == plan.activation_id
    assert handle.data["session"] == plan.session_id
    assert handle.data["attempt"] == "1"
    assert handle.data["status"] == "running"
    written = json.loads((plan.host_dir / "input.json").read_text())
    assert written["workspace"] == "/workspace"
    assert written["token"] == "sza1.bogus.token"
    assert await watch(backend, handle) == Exit(7, "exited", "status exited, exit code 7")
    await backend.cleanup(handle, succeeded=False)


async def test_container_is_locked_down_and_secrets_stay_out_of_logs(
    make_backend, engine, tmp_path, monkeypatch, caplog, capfd
):
    captured = structlog.testing.LogCapture()
    raw = structlog.wrap_logger(
        None, processors=[captured], wrapper_class=structlog.stdlib.BoundLogger
    )
    monkeypatch.setattr(docker_backend, "log", raw)
    caplog.set_level(logging.DEBUG)
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "data.txt").write_text("granted data")
    backend = make_backend()
    egress = make_plan(tmp_path, entry=SLEEP, mounts=(MountPlan(granted, "/data", writable=False),))
    # The broker's socket a sandbox without network gets (only it, not its directory).
    socket_dir = Path(tempfile.mkdtemp(prefix="szd-", dir="/tmp"))  # noqa: S108
    broker_socket = bind_unix(socket_dir / "broker.sock")
    (socket_dir / "not-for-sandboxes.txt").write_text("private")
    isolated = make_plan(
        tmp_path, entry=SLEEP, network=NetworkProfile.NONE, broker_socket=broker_socket.path
    )
    handles = [await backend.launch(egress), await backend.launch(isolated)]
    info = await until_running(engine, handles[0])
    host = info["HostConfig"]
    assert info["Config"]["User"] == "65534:65534"
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Privileged"] is False
    assert host["ReadonlyRootfs"] is True
    assert "/tmp" in host["Tmpfs"]
    assert host["PidsLimit"] == 128
    assert host["Memory"] == 256 * 1024 * 1024
    assert host["NanoCpus"] == 500_000_000
    assert host["NetworkMode"] == "host"
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/activation/input.json"]["RW"] is False
    assert mounts["/activation/input.json"]["Source"] == str(egress.host_dir / "input.json")
    assert mounts["/workspace"]["RW"] is True
    assert mounts["/workspace/session"]["Source"] == str(egress.session_dir)
    assert mounts["/data"]["RW"] is False
    labels = info["Config"]["Labels"]
    assert labels["io.suzumio.managed"] == "true"
    assert labels["io.suzumio.project"] == egress.project_id
    assert labels["io.suzumio.agent"] == egress.agent_id
    assert labels["io.suzumio.session"] == egress.session_id
    assert labels["io.suzumio.activation"] == egress.activation_id
    assert labels["io.suzumio.attempt"] == "1"
    assert f"SUZUMIO_MODEL_API_KEY={SECRET}" in info["Config"]["Env"]
    assert SECRET not in json.dumps(labels)

    code, out = exec_in(engine, handles[0].sandbox_id, _PROBE)
    assert code == 0, out
    assert json.loads(out) == {
        "uid": 65534,
        "input": True,
        "input_writable": False,
        "workspace_writable": True,
        "session_writable": True,
        "root_writable": False,
        "data": "granted data",
        "data_writable": False,
    }
    assert (egress.session_dir / "probe.txt").read_text() == "ok"  # the session dir is shared
    isolated_info = await until_running(engine, handles[1])
    assert isolated_info["HostConfig"]["NetworkMode"] == "none"
    assert isolated_info["HostConfig"]["ExtraHosts"] in (None, [])
    isolated_mounts = {m["Destination"]: m for m in isolated_info["Mounts"]}
    sock_mount = isolated_mounts["/activation/broker.sock"]
    assert (sock_mount["Source"], sock_mount["RW"]) == (str(broker_socket.path), False)
    assert not any(m["Source"] == str(socket_dir) for m in isolated_info["Mounts"])
    code, out = exec_in(engine, handles[1].sandbox_id, _OFFLINE_PROBE)
    assert code == 0, out
    assert json.loads(out) == {
        "socket": True,
        "controller_socket": "/activation/broker.sock",
        "controller_url": "http://suzumio-broker",
        "interfaces": ["lo"],
    }
    broker_socket.sock.close()
    shutil.rmtree(socket_dir)

    for handle in handles:
        await backend.cancel(handle)
        await watch(backend, handle)
        await backend.cleanup(handle, succeeded=False)
    launched = [e for e in captured.entries if e["event"] == "docker.launched"]
    assert len(launched) == 2
    assert launched[0]["env"]["SUZUMIO_MODEL_API_KEY"] == "***"
    out, err = capfd.readouterr()
    logged = json.dumps(captured.entries, default=str) + caplog.text + out + err
    assert SECRET not in logged
    assert SECRET not in json.dumps([h.data for h in handles])


# The start of a probe run inside a sandbox: can it write at a path?
WRITABLE = """
import json, os
def writable(path):
    try:
        with open(path, "a") as f:
            f.write("ok")
        return True
    except OSError:
        return False
"""

_PROBE = (
    WRITABLE
    + """print(json.dumps({
    "uid": os.getuid(),
    "input": os.access("/activation/input.json", os.R_OK)
        and json.load(open("/activation/input.json"))["workspace"] == "/workspace",
    "input_writable": writable("/activation/input.json"),
    "workspace_writable": writable("/workspace/probe.txt"),
    "session_writable": writable("/workspace/session/probe.txt"),
    "root_writable": writable("/probe.txt"),
    "data": open("/data/data.txt").read(),
    "data_writable": writable("/data/data.txt"),
}))
"""
)


# In a sandbox without network: the broker's socket is there (a socket), the input names it,
# and the only network interface is loopback.
_OFFLINE_PROBE = """
import json, os, stat
spec = json.load(open("/activation/input.json"))
print(json.dumps({
    "socket": stat.S_ISSOCK(os.stat("/activation/broker.sock").st_mode),
    "controller_socket": spec["controller_socket"],
    "controller_url": spec["controller_url"],
    "interfaces": sorted(os.listdir("/sys/class/net")),
}))
"""


async def test_cancel_kills_it_and_watch_returns(make_backend, engine, tmp_path):
    backend = make_backend()
    handle = await backend.launch(make_plan(tmp_path, entry=SLEEP))
    await until_running(engine, handle)
    watching = asyncio.create_task(backend.watch(handle))
    await asyncio.sleep(0.2)
    assert not watching.done()
    await asyncio.wait_for(backend.cancel(handle), STEP)
    ended = await asyncio.wait_for(watching, STEP)
    assert ended.reason == "cancelled"
    assert ended.code is None  # ended by a signal, not by the runner
    await backend.cancel(handle)  # again: nothing happens
    await backend.cleanup(handle, succeeded=False)
    await backend.cancel(handle)  # gone: still fine
    with pytest.raises(NotFound):
        engine.inspect_container(handle.sandbox_id)


async def test_a_container_removed_while_watched_is_gone_with_its_exit_code(
    make_backend, engine, tmp_path
):
    """Removed behind our back (an operator, a daemon's cleanup): its exit code went with it,
    and the engine ends the activation by the output it recorded, if it did."""
    backend = make_backend()
    handle = await backend.launch(make_plan(tmp_path, entry=SLEEP))
    await until_running(engine, handle)
    watching = asyncio.create_task(backend.watch(handle))
    await asyncio.sleep(0.2)
    engine.remove_container(handle.sandbox_id, force=True)
    ended = await asyncio.wait_for(watching, STEP)
    assert (ended.code, ended.reason, ended.gone) == (None, "lost", True), ended


async def test_crash_is_reported_with_its_exit_code(make_backend, tmp_path):
    backend = make_backend()
    handle = await backend.launch(
        make_plan(tmp_path, entry=("python3", "-c", "import sys; sys.exit(3)"))
    )
    ended = await watch(backend, handle)
    assert (ended.code, ended.reason) == (3, "exited")


async def test_out_of_memory_is_reported(make_backend, tmp_path):
    backend = make_backend()
    hog = ("python3", "-c", "b = [bytearray(1 << 20) for _ in range(1024)]")
    small = ResourceLimits(cpus=0.5, memory_mb=64, disk_mb=512, pids=128)
    handle = await backend.launch(make_plan(tmp_path, entry=hog, limits=small))
    ended = await watch(backend, handle)
    assert (ended.code, ended.reason) == (None, "oom"), ended


@pytest.mark.parametrize(
    ("policy", "succeeded", "removed"),
    [
        ("always", True, True),
        ("always", False, True),
        ("never", True, False),
        ("never", False, False),
        ("on_success", True, True),
        ("on_success", False, False),
    ],
)
async def test_cleanup_policy(make_backend, engine, tmp_path, policy, succeeded, removed):
    backend = make_backend(cleanup=policy)
    code = 0 if succeeded else 3
    handle = await backend.launch(
        make_plan(tmp_path, entry=("python3", "-c", f"import sys; sys.exit({code})"))
    )
    assert (await watch(backend, handle)).code == code
    await backend.cleanup(handle, succeeded=succeeded)
    if removed:
        with pytest.raises(NotFound):
            engine.inspect_container(handle.sandbox_id)
    else:
        assert engine.inspect_container(handle.sandbox_id)["State"]["Status"] == "exited"


@pytest.mark.parametrize("policy", ["never", "on_success"])
async def test_a_container_kept_by_the_policy_is_kept_stopped(
    make_backend, engine, tmp_path, policy
):
    """An attempt can end while its container runs on: the engine was out of reach until the
    watch gave up on it (lost, retried). Kept for a person to look at, it must not run beside
    the retry."""
    backend = make_backend(cleanup=policy)
    handle = await backend.launch(make_plan(tmp_path, entry=SLEEP))
    await until_running(engine, handle)
    await asyncio.wait_for(backend.cleanup(handle, succeeded=False), STEP)
    assert engine.inspect_container(handle.sandbox_id)["State"]["Status"] == "exited"
    await backend.cleanup(handle, succeeded=False)  # again (exited already): fine


async def test_a_fresh_backend_finds_and_watches_what_runs(make_backend, engine, tmp_path):
    first = make_backend(cleanup="never")
    running = await first.launch(make_plan(tmp_path, entry=SLEEP))
    finished = await first.launch(make_plan(tmp_path, entry=("python3", "-c", "pass")))
    await watch(first, finished)
    other = make_backend(namespace=f"other-{uuid4().hex[:8]}")
    stranger = await other.launch(make_plan(tmp_path, entry=SLEEP))
    await first.close()

    fresh = make_backend()  # an orchestrator after a restart: same namespace, no memory
    found = {h.activation_id: h for h in await fresh.list_live()}
    assert set(found) == {running.activation_id, finished.activation_id}
    assert stranger.activation_id not in found
    again = found[running.activation_id]
    assert again.sandbox_id == running.sandbox_id
    assert again.data == running.data  # status "running", the ids, the name
    assert again.data["session"] == running.data["session"]
    assert found[finished.activation_id].data["status"] == "exited"
    assert (again.finished, found[finished.activation_id].finished) == (False, True)
    assert await watch(fresh, found[finished.activation_id]) == Exit(
        0, "exited", "status exited, exit code 0"
    )

    watching = asyncio.create_task(fresh.watch(again))
    await asyncio.sleep(0.2)
    assert not watching.done()
    engine.kill(again.sandbox_id)  # killed from outside: not a cancel of ours
    ended = await asyncio.wait_for(watching, STEP)
    assert (ended.code, ended.reason) == (None, "killed")


async def test_another_installations_containers_in_the_namespace_are_none_of_its_own(
    make_backend, tmp_path
):
    """Two installations that kept the default namespace on one Docker engine: each one's
    reconciliation found the other's containers as orphans of its own, and stopped them.
    An unlabelled one is from a release before installations were told apart: still ours."""
    mine = await make_backend(installation="inst-a").launch(make_plan(tmp_path, entry=SLEEP))
    theirs = await make_backend(installation="inst-b").launch(make_plan(tmp_path, entry=SLEEP))
    older = await make_backend().launch(make_plan(tmp_path, entry=SLEEP))

    found = {h.activation_id for h in await make_backend(installation="inst-a").list_live()}
    assert found == {mine.activation_id, older.activation_id}
    assert theirs.activation_id not in found
    everyone = {h.activation_id for h in await make_backend().list_live()}
    assert theirs.activation_id in everyone  # the filter is the installation's, not a fluke


async def test_health_reports_engine_and_image(make_backend, image):
    health = await make_backend().health()
    assert health.ok, health.detail
    assert health.detail["engine"] == "reachable"
    assert health.detail["server_version"]
    assert health.detail["image"] == image
    assert health.detail["image_present"] is True
    assert health.detail["content_hash"] == runner_image.image_hash(image)

    missing = await make_backend(image="suzumio-runner:no-such-tag").health()
    assert not missing.ok
    assert missing.detail["image_present"] is False
    down = await make_backend(base_url="unix:///nonexistent/docker.sock").health()
    assert not down.ok
    assert down.detail["engine"] == "unreachable"


def test_bridge_networks_reach_the_host_through_the_gateway():
    # This engine has no bridge (host networking), so only the URL rewrite is checked here.
    assert docker_settings.via_gateway("http://127.0.0.1:8081/x") == (
        "http://host.docker.internal:8081/x"
    )
    assert docker_settings.via_gateway("http://localhost/") == "http://host.docker.internal/"
    assert docker_settings.via_gateway("https://broker.example:443") == (
        "https://broker.example:443"
    )
    settings = DockerSettings(network_mode_egress="suzumio-net")
    networks = docker_settings.choose_networks(settings, {"host", "none"})
    assert networks.of(NetworkProfile.EGRESS) == "suzumio-net"
    assert networks.of(NetworkProfile.FULL) == "suzumio-net"
    assert networks.of(NetworkProfile.NONE) == "none"


async def test_a_create_whose_answer_was_lost_leaves_no_container(
    make_backend, engine, tmp_path, monkeypatch
):
    """The engine made the container, the answer never came (a read timeout): the launch
    fails (retryable), and the container — the plan's keys in its env — is not left behind
    for the next attempt, which has another name."""
    backend = make_backend()
    plan = make_plan(tmp_path, entry=SLEEP)
    create = DockerBackend._create

    def made_but_unanswered(self, api, *args):
        create(self, api, *args)
        raise requests.ReadTimeout("read timed out")

    monkeypatch.setattr(DockerBackend, "_create", made_but_unanswered)
    with pytest.raises(LaunchError) as refused:
        await backend.launch(plan)
    assert refused.value.retryable
    assert engine.containers(all=True, filters={"name": backend._name(plan)}) == []


class GivenUpAt(threading.Event):
    """Not given up when the launch's thread looks the first times; given up from its look
    number `at` on (2: once its files are prepared, 3: when it meets the name taken)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.looks = 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.at


@pytest.mark.parametrize("at", [2, 3], ids=["after_prepare", "at_the_name"])
async def test_a_launch_given_up_midway_removes_no_other_launchs_container(
    make_backend, engine, image, tmp_path, at
):
    """A leader that steps down cancels its launch, but the launch's thread goes on. Meeting a
    container of the attempt's name (a new leader's launch, made and not yet started) it must
    leave it alone — it used to take it for its own crash's leftover and remove it, and the new
    leader's start then failed for good — and it starts nothing of its own."""
    backend = make_backend()
    plan = make_plan(tmp_path, entry=SLEEP)
    network = (await backend._call(backend._network_choice)).of(plan.profile.network)
    api = backend._client()
    await asyncio.to_thread(backend._prepare, plan, network)
    theirs = await asyncio.to_thread(
        backend._create, api, plan, image, backend._name(plan), network
    )
    abandoned = GivenUpAt(at)
    with pytest.raises(docker_backend._AbandonedError):
        await asyncio.to_thread(backend._launch_sync, plan, image, network, abandoned)
    assert abandoned.looks == at
    named = engine.inspect_container(backend._name(plan))  # theirs, and no other
    assert (named["Id"], named["State"]["Status"]) == (theirs, "created")


async def test_a_container_removed_by_its_own_launch_while_adopted_frees_the_name(
    make_backend, engine, image, tmp_path, monkeypatch
):
    """A new leader's launch found the attempt's name taken by a container that was not
    running (the old leader's, given up): while it went to remove it, the old thread removed
    it itself. The engine's 404 failed the new launch for good; the name is free, and the
    launch goes on."""
    backend = make_backend()
    plan = make_plan(tmp_path, entry=SLEEP)
    network = (await backend._call(backend._network_choice)).of(plan.profile.network)
    api = backend._client()
    await asyncio.to_thread(backend._prepare, plan, network)
    name = backend._name(plan)
    await asyncio.to_thread(backend._create, api, plan, image, name, network)
    inspect = api.inspect_container

    def inspected_then_removed(container: str) -> Any:
        info = inspect(container)
        engine.remove_container(info["Id"], force=True)  # the other thread's removal
        return info

    monkeypatch.setattr(api, "inspect_container", inspected_then_removed)
    assert await asyncio.to_thread(backend._adopt, api, name, plan) is None


async def test_a_launch_cancelled_while_its_thread_works_leaves_no_container(
    make_backend, engine, tmp_path, monkeypatch
):
    """Its leader stepped down (the launch cancelled) while the thread prepared the files: the
    thread goes on, but starts nothing that nobody would watch."""
    backend = make_backend()
    plan = make_plan(tmp_path, entry=SLEEP)
    prepare, prepared = backend._prepare, threading.Event()

    def slow_prepare(*args: Any) -> None:
        prepare(*args)
        prepared.set()
        time.sleep(0.5)  # the cancel comes meanwhile

    launch_sync, done = backend._launch_sync, threading.Event()

    def watched(*args: Any) -> str:
        try:
            return str(launch_sync(*args))
        finally:
            done.set()

    monkeypatch.setattr(backend, "_prepare", slow_prepare)
    monkeypatch.setattr(backend, "_launch_sync", watched)
    launching = asyncio.create_task(backend.launch(plan))
    assert await asyncio.to_thread(prepared.wait, STEP)
    launching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await launching
    assert await asyncio.to_thread(done.wait, STEP)  # the thread went on to its end
    assert engine.containers(all=True, filters={"name": backend._name(plan)}) == []


async def test_a_container_removed_before_its_start_fails_the_launch_as_retryable(
    make_backend, engine, tmp_path, monkeypatch
):
    """The other side of that race: this launch's container was removed between its create and
    its start (by another launch of the attempt). The engine says 404, a client error, which
    failed the attempt for good; nothing is wrong with the plan, so it is tried again."""
    backend = make_backend()
    api = backend._client()
    start = api.start

    def removed_first(container_id: str) -> None:
        engine.remove_container(container_id, force=True)
        start(container_id)

    monkeypatch.setattr(api, "start", removed_first)
    with pytest.raises(LaunchError) as failed:
        await backend.launch(make_plan(tmp_path, entry=SLEEP))
    assert failed.value.retryable, failed.value
    assert "removed before it started" in str(failed.value)


async def test_bad_launches_are_refused(make_backend, tmp_path):
    backend = make_backend(pull_missing=False)
    for target in ("/workspace/x", "/activation", "/etc", "/tmp", "relative", "/a/../etc"):
        plan = make_plan(tmp_path, mounts=(MountPlan(tmp_path, target),))
        with pytest.raises(LaunchError) as refused:
            await backend.launch(plan)
        assert not refused.value.retryable
    plan = make_plan(tmp_path)
    plan = LaunchPlan(
        **{**plan.__dict__, "profile": plan.profile.model_copy(update={"image": "nope:none"})}
    )
    with pytest.raises(LaunchError, match="not on the engine") as missing:
        await backend.launch(plan)
    assert not missing.value.retryable


async def test_a_stalled_pull_fails_its_launch_in_time_and_holds_no_call_thread(
    make_backend: MakeBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker-py's pull has no time limit: a stalled registry held its launch (no cancel, no
    wall clock yet) and one of the backend's call threads — enough of them, every stop and
    listing waited. The launch fails, retryable, at the pull's time limit, and the backend's
    other calls go on meanwhile. (The pull stands in for a registry that never answers.)"""
    release = threading.Event()

    def stalled(self: DockerBackend, image: str) -> None:
        release.wait(60)

    monkeypatch.setattr(DockerBackend, "_pull_sync", stalled)
    backend = make_backend(max_threads=2, pull_timeout_seconds=1)
    missing = RuntimeProfileSpec(backend=Backend.DOCKER, image="suzumio-missing:never")
    try:
        plans = [replace(make_plan(tmp_path / str(i)), profile=missing) for i in range(3)]
        results = await asyncio.wait_for(
            asyncio.gather(*(backend.launch(p) for p in plans), return_exceptions=True), STEP
        )
        assert all(isinstance(r, LaunchError) and r.retryable for r in results), results
        assert all("took more than 1 s" in str(r) for r in results), results
        await asyncio.wait_for(backend.list_live(), 10)  # its call threads are free
    finally:
        release.set()
