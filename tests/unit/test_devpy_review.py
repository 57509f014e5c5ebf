"""dev.py and tools/docker_engine.py under the failures a first run meets: an install killed
half-way, two commands at once, pip or apt-get failing, a stale dockerd pid file.

No network and no real dockerd: pip is stood in for, and `dockerd` is a script on PATH.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import venv
from pathlib import Path

import dev
import pytest
from tools import docker_engine


@pytest.fixture
def fake_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """dev.py pointed at a venv in tmp_path whose python is this one (it has pip)."""
    root = tmp_path / ".venv"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setattr(dev, "VENV", root)
    monkeypatch.setattr(dev, "INSTALL_LOCK", tmp_path / "install.lock", raising=False)
    return root


def test_a_venv_left_without_pip_is_repaired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # What `venv` leaves when killed while it bootstraps pip: a python, no pip.
    root = tmp_path / ".venv"
    venv.create(root, with_pip=False)
    (root / ".installed-runtime").write_text("stale")
    monkeypatch.setattr(dev, "VENV", root)
    monkeypatch.setattr(dev, "INSTALL_LOCK", tmp_path / "install.lock", raising=False)
    pips: list[tuple[str, ...]] = []
    monkeypatch.setattr(dev, "_pip", lambda *args: pips.append(args))

    dev.install()

    python = root / "bin" / "python"
    assert subprocess.run([python, "-c", "import pip"], check=False).returncode == 0
    assert len(pips) == 1  # and then the packages, into the repaired venv


def test_two_installs_do_not_run_pip_at_once(fake_venv: Path, monkeypatch: pytest.MonkeyPatch):
    started = threading.Event()
    monkeypatch.setattr(dev, "_pip", lambda *_: started.set())
    lock = fake_venv.parent / "install.lock"
    with lock.open("w") as held:  # another dev.py command, installing
        fcntl.flock(held, fcntl.LOCK_EX)
        worker = threading.Thread(target=dev.install)
        worker.start()
        assert not started.wait(1.0), "pip ran while another install held the venv"
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(10)
    assert started.is_set()
    assert (fake_venv / ".installed-runtime").exists()


def test_a_failed_pip_says_what_to_do(
    fake_venv: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    def failing(*args: str) -> None:
        raise subprocess.CalledProcessError(2, ["pip", "install", *args])

    monkeypatch.setattr(dev, "_pip", failing)
    assert dev.main(["install"]) == 1
    assert "run the same command again" in capsys.readouterr().err
    assert not (fake_venv / ".installed-runtime").exists()


@pytest.fixture
def engine_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """docker_engine with its lock, state and pid file in tmp_path, as root with apt-get."""
    monkeypatch.setattr(docker_engine, "LOCK", tmp_path / "engine.lock")
    monkeypatch.setattr(docker_engine, "STATE", tmp_path / "state")
    monkeypatch.setattr(docker_engine, "PIDFILE", tmp_path / "docker.pid", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    return tmp_path


def test_an_answering_engine_survives_a_failed_apt_get(
    engine_sandbox: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(docker_engine, "_missing", lambda: ["bubblewrap"])
    monkeypatch.setattr(docker_engine, "_apt_install", lambda _: False)  # locked, offline
    monkeypatch.setattr(docker_engine, "engine_answers", lambda timeout=10.0: True)
    assert docker_engine.ensure_engine()


def _fake_dockerd(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `dockerd` that fails as the real one does on a live pid in its pid file (7), and
    otherwise exits 3 at once."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    script = bin_dir / "dockerd"
    script.write_text(f'#!/bin/sh\n[ -e "{tmp / "docker.pid"}" ] && exit 7\nexit 3\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(docker_engine, "_missing", list)
    monkeypatch.setattr(docker_engine, "engine_answers", lambda timeout=10.0: False)
    return script


def test_a_stale_pid_file_is_removed_before_dockerd_starts(
    engine_sandbox: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    _fake_dockerd(engine_sandbox, monkeypatch)
    monkeypatch.setattr(docker_engine, "START_TIMEOUT", 5.0)
    pidfile = engine_sandbox / "docker.pid"
    pidfile.write_text(f"{os.getpid()}\n")  # alive, and no dockerd: a recycled pid

    assert not docker_engine._install_and_start(install=False)
    assert not pidfile.exists()
    assert "exited with code 3" in capsys.readouterr().err  # not 7: it saw no pid file


def test_a_dockerd_that_exits_is_reported_at_once(
    engine_sandbox: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    _fake_dockerd(engine_sandbox, monkeypatch)
    monkeypatch.setattr(docker_engine, "START_TIMEOUT", 20.0)
    started = time.monotonic()
    assert not docker_engine._install_and_start(install=False)
    assert time.monotonic() - started < 10
    assert "dockerd exited with code 3" in capsys.readouterr().err


def test_a_python_without_ensurepip_is_told_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Debian's python3 without python3.X-venv: its venv would exit the process itself after
    # leaving a python without pip behind.
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ensurepip" else real(name)
    )
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # not root: may not apt-get
    monkeypatch.setattr(dev, "VENV", tmp_path / ".venv")
    monkeypatch.setattr(dev, "INSTALL_LOCK", tmp_path / "install.lock", raising=False)
    monkeypatch.setattr(dev, "_pip", lambda *_: None)
    with pytest.raises(SystemExit) as exited:
        dev.install()
    assert f"apt-get install python3.{sys.version_info.minor}-venv" in str(exited.value.code)


def test_a_ctrl_c_lets_the_command_end_on_its_own(tmp_path: Path) -> None:
    """subprocess.run killed the command 0.25 s after a Ctrl-C: pytest's teardown never ran,
    and what the tests had started (containers, servers) was left. The command is let end —
    here one that takes half a second over its SIGINT (passed on to it: the Ctrl-C reached
    dev.py alone, run in a process of its own here) and says it did."""
    done = tmp_path / "torn-down"
    ready = tmp_path / "ready"
    command = (
        "import signal, sys, time, pathlib\n"
        "def stop(*_):\n"
        "    time.sleep(0.5)\n"
        f"    pathlib.Path({str(done)!r}).write_text('yes')\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        f"pathlib.Path({str(ready)!r}).write_text('yes')\n"
        "time.sleep(30)\n"
    )
    # SIGINT as a terminal's python has it: one started in the background (CI's pytest) is
    # handed it ignored, and would never hear the Ctrl-C.
    runner = (
        "import signal, sys, dev\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"sys.exit(dev.run(sys.executable, '-c', {command!r}))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", runner],
        cwd=Path(dev.__file__).parent,
        start_new_session=True,  # no terminal of ours: the Ctrl-C reaches dev.py alone
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        process.send_signal(signal.SIGINT)
        code = process.wait(20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert done.read_text() == "yes"
    assert code == 3
