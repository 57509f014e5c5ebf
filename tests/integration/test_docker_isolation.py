"""What keeps a docker sandbox off the host, against this machine's real engine and the real
runner image (DESIGN.md §8, §10): the network it joins (this engine has no bridge, so the
host's, with a warning), granted mounts checked again right before the bind, and the user it
runs as when the orchestrator is not root. Every container made here is removed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
import structlog

from suzumio.contracts.values import NetworkProfile
from suzumio.orchestrator.backends import docker as docker_backend
from suzumio.orchestrator.backends.base import LaunchError, MountPlan
from suzumio.orchestrator.backends.docker_settings import (
    DockerSettings,
    Networks,
    choose_networks,
)
from tests.integration import test_docker_backend as dock

pytestmark = pytest.mark.timeout(300)
# The fixtures of the docker backend's own tests: the engine, the image, backends cleaned up.
image = dock.image
engine = dock.engine
make_backend = dock.make_backend
make_plan = dock.make_plan
REPO = Path(__file__).resolve().parents[2]
UNPRIVILEGED = 10001  # the uid compose.yaml runs the orchestrator as


def engine_networks(engine) -> set[str]:
    return {n["Name"] for n in engine.networks()}


def test_the_engines_own_networks_decide_the_default(engine):
    here = engine_networks(engine)
    assert "bridge" not in here, "this test expects the engine tools/docker_engine.py starts"
    assert choose_networks(DockerSettings(), here) == Networks("host", "host", host_fallback=True)
    assert choose_networks(DockerSettings(network_mode_egress="none"), here) == Networks(
        "none", "none"
    )
    # An engine with its default bridge, as `docker network ls` lists it (none here to ask).
    assert choose_networks(DockerSettings(), here | {"bridge"}) == Networks("bridge", "bridge")


async def test_without_a_bridge_sandboxes_fall_back_to_the_host_network_and_say_so(
    make_backend, engine, tmp_path, monkeypatch
):
    captured = structlog.testing.LogCapture()
    raw = structlog.wrap_logger(
        None, processors=[captured], wrapper_class=structlog.stdlib.BoundLogger
    )
    monkeypatch.setattr(docker_backend, "log", raw)
    backend = make_backend()
    health = await backend.health()
    assert health.ok, health.detail
    assert health.detail["network"] == {"egress": "host", "full": "host"}
    assert "no bridge network" in health.detail["warning"]
    for network in (NetworkProfile.EGRESS, NetworkProfile.FULL):
        plan = make_plan(tmp_path, entry=("python3", "-c", "pass"), network=network)
        handle = await backend.launch(plan)
        assert engine.inspect_container(handle.sandbox_id)["HostConfig"]["NetworkMode"] == "host"
        await dock.watch(backend, handle)
        await backend.cleanup(handle, succeeded=True)
    await backend.health()
    fallbacks = [e for e in captured.entries if e["event"] == "docker.host_network_fallback"]
    assert len(fallbacks) == 1, "warned once per backend"
    assert fallbacks[0]["log_level"] == "warning"

    chosen = make_backend(network_mode_egress="host")  # an operator's explicit choice
    health = await chosen.health()
    assert health.detail["network"] == {"egress": "host", "full": "host"}
    assert "warning" not in health.detail


async def test_a_link_planted_in_a_granted_path_is_refused_at_launch(
    make_backend, engine, tmp_path
):
    granted = tmp_path.resolve() / "granted" / "inner"
    granted.mkdir(parents=True)
    (granted / "data.txt").write_text("granted data")
    backend = make_backend()
    read = ("python3", "-c", "print(open('/data/data.txt').read())")
    normal = make_plan(tmp_path, entry=read, mounts=(MountPlan(granted, "/data"),))
    handle = await backend.launch(normal)
    assert (await dock.watch(backend, handle)).code == 0
    assert "granted data" in engine.logs(handle.sandbox_id).decode()
    await backend.cleanup(handle, succeeded=True)

    # What an agent with the parent writable can do after the grant was checked.
    shutil.rmtree(granted)
    granted.symlink_to("/etc")
    planted = make_plan(tmp_path, entry=read, mounts=(MountPlan(granted, "/data"),))
    with pytest.raises(LaunchError, match="resolves to /etc") as refused:
        await backend.launch(planted)
    assert not refused.value.retryable
    ours = {"label": f"io.suzumio.activation={planted.activation_id}"}
    assert engine.containers(all=True, filters=ours) == []


@pytest.fixture
def unprivileged_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="suzumio-nonroot-", dir="/tmp"))  # noqa: S108
    os.chown(path, UNPRIVILEGED, UNPRIVILEGED)
    yield path
    shutil.rmtree(path, ignore_errors=True)


_LAUNCH_AS_ITSELF = """
import asyncio, json, sys
from pathlib import Path
from suzumio.orchestrator.backends.docker import DockerBackend, DockerSettings
from tests.integration.test_docker_backend import WRITABLE, make_plan

PROBE = WRITABLE + '''print(json.dumps({"uid": os.getuid(), "gid": os.getgid(),
    "token": json.load(open("/activation/input.json"))["token"],
    "workspace_writable": writable("/workspace/out/probe.txt"),
    "session_writable": writable("/workspace/session/probe.txt")}))
'''

async def main(root, image, namespace):
    backend = DockerBackend(DockerSettings(image=image), namespace=namespace)
    try:
        plan = make_plan(Path(root), entry=("python3", "-c", PROBE))
        handle = await backend.launch(plan)
        ended = await asyncio.wait_for(backend.watch(handle), 60)
        logs = backend._client().logs(handle.sandbox_id).decode()
        await backend.cleanup(handle, succeeded=True)
        print(json.dumps({"code": ended.code, "logs": logs, "host_dir": str(plan.host_dir),
                          "session_dir": str(plan.session_dir)}))
    finally:
        await backend.close()

asyncio.run(main(*sys.argv[1:]))
"""


def test_a_non_root_orchestrator_runs_sandboxes_as_itself_with_private_files(
    image, engine, unprivileged_dir
):
    """As compose.yaml runs it (uid 10001, the engine's socket through the docker group): it
    cannot give files to 65534, so the sandbox runs as 10001 and nothing is opened to all."""
    namespace = f"test-{uuid4().hex[:10]}"
    socket_gid = Path("/var/run/docker.sock").stat().st_gid
    try:
        run = subprocess.run(
            [sys.executable, "-c", _LAUNCH_AS_ITSELF, str(unprivileged_dir), image, namespace],
            cwd=REPO,
            env={"PATH": os.environ["PATH"], "HOME": str(unprivileged_dir), "PYTHONPATH": "."},
            user=UNPRIVILEGED,
            group=UNPRIVILEGED,
            extra_groups=[socket_gid],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        labelled = {"label": f"io.suzumio.namespace={namespace}"}
        for c in engine.containers(all=True, filters=labelled):
            engine.remove_container(c["Id"], force=True)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, result
    probe = json.loads(result["logs"].strip().splitlines()[-1])
    assert probe == {
        "uid": UNPRIVILEGED,
        "gid": UNPRIVILEGED,
        "token": "sza1.bogus.token",
        "workspace_writable": True,
        "session_writable": True,
    }
    host_dir, session_dir = Path(result["host_dir"]), Path(result["session_dir"])
    token = (host_dir / "input.json").stat()
    assert (token.st_uid, token.st_mode & 0o777) == (UNPRIVILEGED, 0o600)
    for top in (host_dir / "workspace", session_dir):
        for base, dirs, files in os.walk(top):
            for name in ("", *dirs, *files):
                st = Path(base, name).stat()
                assert st.st_uid == UNPRIVILEGED, Path(base, name)
                assert st.st_mode & 0o022 == 0, (Path(base, name), oct(st.st_mode))
