"""The process backend (the embedded default): the runner as a local process in its own
workspace and process group, with a scrubbed environment and resource limits.

The runner is started through a small shell that writes its exit code to `exit_code` in the
activation's directory, and the pid and its start time go to `records/<activation>.json`
beside the activations' directories (out of the sandbox's reach: the activation's directory
is bound writable into it): after an orchestrator restart the process (in a session of its
own, so it outlives its parent) is found again from those files, watched by polling, and its
exit code read back.

Without isolation tools this is process separation, not a security boundary: the runner runs
as the orchestrator's user. With `bwrap` (bubblewrap) installed and `isolate` on, it runs in
new PID/IPC/UTS/mount namespaces without any capability, with a read-only view of the host in
which the platform's own directories (`hide`: the data directory, every sandbox) are empty, a
private /tmp (the runner's own Python and import path bound back read-only where masked),
and only its own workspace, its session directory and the granted mounts writable. The rest
of the host stays readable as the orchestrator's user reads it: for a boundary, use the
docker or kubernetes backend. Network `none` needs bubblewrap: the runner then also gets a
network namespace of its own (loopback only), and the tool-broker's Unix socket bound in at its
host path, its one way out (to the broker and its model relay).

The profile's limits (`suzumio.runner.limits`): a cgroup of its own per activation, named by
it, where the host allows (made at launch, emptied and removed at cleanup, and the empty ones
of activations gone swept at reconciliation); per-process rlimits otherwise, and `health()`
says which profile limits this host leaves unenforced.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

import suzumio.runner.limits as sandbox_limits
from suzumio.contracts.runner import MountSpec
from suzumio.contracts.values import NetworkProfile
from suzumio.orchestrator.backends.base import (
    OFFLINE_BROKER_URL,
    CleanupPolicy,
    Exit,
    Handle,
    Health,
    LaunchError,
    LaunchPlan,
)
from suzumio.platform.embedded.process import pid_alive
from suzumio.platform.logging import get_logger

log = get_logger(__name__)
NAME = "process"
RECORD = "process.json"  # where a release before `RECORDS` kept it: the activation's directory
RECORDS = "records"  # beside `activations/`: `<activation>.json`, out of the sandboxes' reach
EXIT_FILE = "exit_code"
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
GONE = -1  # the recorded start time of a runner that ended before it could be read
CGROUP_OWNER = "suzumio-process"  # the activations' cgroups: <own cgroup>/<this>-<root>/<id>


# Where a host keeps its services' socket files (`/var/run` is mostly a link to `/run`).
RUNTIME_DIRS = (Path("/run"), Path("/var/run"))


def _emptied(dirs: tuple[Path, ...]) -> list[str]:
    """bubblewrap's arguments putting an empty tmpfs over each of `dirs` that is a directory
    of its own (a link to another is emptied with it)."""
    args: list[str] = []
    for path in dirs:
        if path.is_dir() and not path.is_symlink():
            args += ["--tmpfs", str(path)]
    return args


def cgroup_owner(root: Path) -> str:
    """The cgroup tree of the backend whose sandboxes are under `root`: one per directory, so
    an orchestrator's sweep of empty cgroups never takes one another orchestrator on the host
    (a test's, a second installation's) just made for a runner about to join it. Replicas
    sharing a directory share the tree; the sweep keeps the cgroups of the activations whose
    directories exist, which are made before their cgroups."""
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    return f"{CGROUP_OWNER}-{digest}"


class ProcessSettings(BaseModel):
    python: str = Field(default=sys.executable, description="the interpreter running the runner")
    isolate: bool = Field(default=True, description="use bubblewrap when it is installed")
    stop_grace_seconds: float = Field(default=3.0, gt=0)
    max_open_files: int = Field(default=1_024, ge=64)
    cgroups: bool = Field(
        default=True,
        description="a cgroup per activation for the profile's memory, pids and cpus, where "
        "the host lets the orchestrator make them; else (or off) per-process rlimits",
    )
    cleanup: CleanupPolicy = Field(
        default="always",
        description="the activation's directory once it ended: removed (always), kept when "
        "it did not complete (on_success) or kept (never); kept ones go by the workspace "
        "retention",
    )
    hide: tuple[Path, ...] = Field(
        default=(),
        description="more host directories an isolated runner must not see (the data "
        "directory and the sandboxes are always hidden)",
    )


def _startup_paths(python: str) -> tuple[Path, ...]:
    """What the runner's Python reads to start: its prefix and the import path (this
    interpreter's, the runner's by default), where an editable install's sources may be
    anywhere — under /tmp or the data directory included."""
    found = []
    candidates = [str(Path(python).absolute().parent.parent), sys.base_prefix, *sys.path]
    for raw in filter(None, candidates):  # "" on sys.path: the current directory, not needed
        with contextlib.suppress(OSError):
            path = Path(raw).resolve()
            if path.is_dir():
                found.append(path)
    return tuple(dict.fromkeys(found))


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks: a pid is only ours if this matches."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return _ticks(stat)


def _ticks(stat: str) -> int:
    return int(stat.rsplit(")", 1)[1].split()[19])


class ProcessBackend:
    name = NAME

    def __init__(
        self, root: Path, settings: ProcessSettings | None = None, data_dir: Path | None = None
    ) -> None:
        self._root = root / "activations"
        # Where each runner's pid and start time are recorded: out of every sandbox's reach
        # (`root` is hidden from them), unlike the activation's directory, which is bound
        # writable into its sandbox — a record there could be rewritten to have a restarted
        # leader trust a forged deadline, or deleted to have it lose a runner that goes on.
        self._records = root / RECORDS
        self._settings = settings or ProcessSettings()
        hide = [root, *([data_dir] if data_dir else []), *self._settings.hide]
        self._hidden = tuple(dict.fromkeys(p.resolve() for p in hide))
        self._startup = _startup_paths(self._settings.python)
        self._children: dict[str, asyncio.subprocess.Process] = {}
        self._bwrap = shutil.which("bwrap") if self._settings.isolate else None
        self._bwrap_problem: str | None = None  # why bubblewrap cannot sandbox here
        self._probed = False
        self._probing = asyncio.Lock()
        self._cgroups: sandbox_limits.Cgroups | None = None
        self._enforcement: sandbox_limits.Enforcement | None = None

    @property
    def cgroup_owner(self) -> str:
        return cgroup_owner(self._root.parent)

    # -- launching -------------------------------------------------------------------------
    async def _isolation_problem(self) -> str | None:
        """Whether bubblewrap can make its namespaces here (inside an unprivileged container it
        often cannot): found out once, so every launch is not a runner that dies at once."""
        if self._bwrap is None or self._probed:
            return self._bwrap_problem
        async with self._probing:
            if not self._probed:
                await self._probe(self._bwrap)
                self._probed = True
        return self._bwrap_problem

    async def _probe(self, bwrap: str) -> None:
        try:
            probe = await asyncio.create_subprocess_exec(
                bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--cap-drop", "ALL",
                "--", "/bin/true",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as exc:
            self._bwrap_problem = repr(exc)
            return
        try:
            _, err = await asyncio.wait_for(probe.communicate(), 10)
        except TimeoutError:
            probe.kill()
            self._bwrap_problem = "it did not start within 10 s"
        else:
            if probe.returncode != 0:
                self._bwrap_problem = err.decode(errors="replace").strip()[-300:] or "failed"
        if self._bwrap_problem is not None:
            log.warning("process.isolation_unavailable", problem=self._bwrap_problem)

    def _containment(self) -> sandbox_limits.Enforcement:
        """The host's cgroups for the activations, found (and the outcome logged) once."""
        if self._enforcement is None:
            found = (
                sandbox_limits.discover(self.cgroup_owner)
                if self._settings.cgroups
                else "turned off (SUZUMIO_PROCESS__CGROUPS=false)"
            )
            if isinstance(found, sandbox_limits.Cgroups):
                self._cgroups, self._enforcement = found, found.enforcement
            else:
                self._enforcement = sandbox_limits.rlimit_enforcement(found)
            if self._enforcement.unenforced:  # said once here, and by every health()
                log.warning("process.limits_unenforced", **self._enforcement.detail())
            else:
                log.info("process.limits", **self._enforcement.detail())
        return self._enforcement

    def _sandbox(self, plan: LaunchPlan) -> sandbox_limits.Sandbox:
        """The activation's cgroup, made now, and its rlimits.

        Raises:
            LaunchError: the cgroup could not be made (not run without its limits).
        """
        self._containment()
        limits = plan.profile.limits
        if self._cgroups is None:
            return sandbox_limits.Sandbox(rlimits=sandbox_limits.rlimits(limits, contained=False))
        try:
            return self._cgroups.create(plan.activation_id, limits)
        except OSError as exc:
            raise LaunchError(f"cannot make the activation's cgroup: {exc}") from exc

    async def launch(self, plan: LaunchPlan) -> Handle:
        problem = await self._isolation_problem()
        if problem is not None:  # refused, not run unisolated behind the operator's back
            raise LaunchError(
                f"bubblewrap cannot isolate the runner here ({problem}); set "
                "SUZUMIO_PROCESS__ISOLATE=false to run it without isolation, or use docker",
                retryable=False,
            )
        workspace = plan.host_dir / "workspace"
        for d in (workspace / "out", plan.session_dir):
            d.mkdir(parents=True, exist_ok=True)
        session_link = workspace / "session"
        if not session_link.exists():
            session_link.symlink_to(plan.session_dir, target_is_directory=True)
        # The runner sees host paths: the session directory and the grants are mounts it may
        # use (there is no bind mount without isolation tools).
        mounts = [MountSpec(path=str(plan.session_dir), writable=True)]
        mounts += [MountSpec(path=str(m.host_path), writable=m.writable) for m in plan.mounts]
        update: dict[str, object] = {"workspace": str(workspace), "mounts": tuple(mounts)}
        if plan.profile.network is NetworkProfile.NONE:
            update |= self._offline(plan)
        spec = plan.input.model_copy(update=update)
        self._records.mkdir(parents=True, exist_ok=True)
        input_path = plan.host_dir / "input.json"
        input_path.unlink(missing_ok=True)
        _write_own(input_path, spec.model_dump_json().encode(), 0o400)
        (plan.host_dir / EXIT_FILE).unlink(missing_ok=True)
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        env.update(plan.env)
        env["HOME"] = str(workspace)
        argv = self._argv(plan, input_path)
        sandbox = await asyncio.to_thread(self._sandbox, plan)
        try:
            runner_log = _open_own(plan.host_dir / "runner.log", os.O_WRONLY | os.O_APPEND)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=workspace,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=runner_log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=self._limits(plan, sandbox),
                )
            finally:
                os.close(runner_log)
        # SubprocessError: the child's own set-up failed (it records itself, see `_limits`).
        except (OSError, subprocess.SubprocessError) as exc:
            await self._remove_cgroup(plan.activation_id)
            raise LaunchError(f"cannot start the runner: {exc}") from exc
        started = _start_time(proc.pid)
        if started is None and not pid_alive(proc.pid):
            # It ended and was reaped already (asyncio's child watcher, a runner failing at
            # once): a start time no process has, or `None == None` would take whoever
            # reuses its pid for it, to list as running and to signal.
            started = GONE
        record = {"pid": proc.pid, "start_time": started, "activation_id": plan.activation_id}
        try:
            _write_own(self._record_path(plan.activation_id), json.dumps(record).encode(), 0o600)
        except OSError as exc:  # it does not run unrecorded
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await self._remove_cgroup(plan.activation_id)
            raise LaunchError(f"cannot record the runner: {exc}") from exc
        self._children[plan.activation_id] = proc
        log.info("process.launched", activation=plan.activation_id, pid=proc.pid)
        return Handle(
            plan.activation_id, NAME, str(proc.pid), {**record, "dir": str(plan.host_dir)}
        )

    def _offline(self, plan: LaunchPlan) -> dict[str, object]:
        """What the input says of the broker in a sandbox without network: its socket.

        Raises:
            LaunchError: no network namespace can be had here, or no socket to bind in.
        """
        if self._bwrap is None:
            raise LaunchError(
                "network 'none' on the process backend needs bubblewrap (bwrap installed, "
                "SUZUMIO_PROCESS__ISOLATE on): without it the runner shares the host's network",
                retryable=False,
            )
        if plan.broker_socket is None:
            raise LaunchError(
                "network 'none' without the broker's socket (SUZUMIO_BROKER_SOCKET)",
                retryable=False,
            )
        return {"controller_url": OFFLINE_BROKER_URL, "controller_socket": str(plan.broker_socket)}

    def _argv(self, plan: LaunchPlan, input_path: Path) -> list[str]:
        # The shell stays only to record the exit code, so a stop's SIGTERM (sent to the whole
        # group) must not end it: a runner that recorded its output exits 0 after it, and lost,
        # that code made finished work a cancelled or timed-out attempt, done again. (A handler
        # set, not ignored, goes back to the default in the runner.)
        runner = 'trap : TERM; "$0" -m suzumio.runner run "$1"; echo $? > "$2"'
        inner = ["/bin/sh", "-c", runner, self._settings.python, str(input_path),
                 str(plan.host_dir / EXIT_FILE)]  # fmt: skip
        if self._bwrap is None:
            return inner
        writable = [
            plan.host_dir,
            plan.session_dir,
            *(m.host_path for m in plan.mounts if m.writable),
        ]
        readonly = [m.host_path for m in plan.mounts if not m.writable]
        # No --die-with-parent: like an unisolated runner it outlives an orchestrator restart.
        # No --new-session either: the sandbox's PID 1 stays in the process group `cancel`
        # signals (it was made a session of its own, out of reach), and killing that PID 1
        # ends the whole PID namespace. A terminal to guard there is none: the launch's own
        # new session left the sandbox without a controlling one.
        args = [self._bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp", "--unshare-pid", "--unshare-ipc", "--unshare-uts",  # noqa: S108
                "--cap-drop", "ALL"]  # fmt: skip
        offline = plan.profile.network is NetworkProfile.NONE
        if offline:
            # A network namespace cuts IP and abstract sockets, not socket files: the host's
            # in /run (systemd-resolved's DNS, the user's D-Bus, an engine's docker.sock)
            # would be ways out. Emptied here; what the activation may use is bound back.
            args += _emptied(RUNTIME_DIRS)
        for path in self._hidden:  # empty; what this activation may use is bound back below
            if path.is_dir():
                args += ["--tmpfs", str(path)]
        masked = (Path("/tmp"), *(RUNTIME_DIRS if offline else ()), *self._hidden)  # noqa: S108
        for path in self._startup:  # the Python it starts, if masked (never a hidden dir again)
            inside = any(path.is_relative_to(m) for m in masked)
            if inside and not any(h.is_relative_to(path) for h in self._hidden):
                args += ["--ro-bind", str(path), str(path)]
        for path in writable:
            args += ["--bind", str(path), str(path)]
        for path in readonly:
            args += ["--ro-bind", str(path), str(path)]
        if offline and plan.broker_socket is not None:
            # Bound after the hidden directories were emptied: it may be in the data directory.
            socket = str(plan.broker_socket)
            args += ["--unshare-net", "--ro-bind", socket, socket]
        return [*args, "--", *inner]

    def _limits(self, plan: LaunchPlan, sandbox: sandbox_limits.Sandbox) -> Callable[[], None]:
        files = self._settings.max_open_files
        record_path = self._record_path(plan.activation_id)
        activation_id = plan.activation_id

        def apply() -> None:
            # Into its cgroup before anything else runs: all it starts is in there too.
            sandbox.apply()
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
            # The child records itself before the runner starts: an orchestrator killed right
            # after the spawn (before its own write of the same record) would leave a runner
            # no restarted leader can find, and the activation launched a second time beside
            # it. The start time does not change across exec.
            with open("/proc/self/stat") as own:  # noqa: PTH123
                started = _ticks(own.read())
            record = {"pid": os.getpid(), "start_time": started, "activation_id": activation_id}
            _write_own(record_path, json.dumps(record).encode(), 0o600)

        return apply

    # -- watching --------------------------------------------------------------------------
    async def watch(self, handle: Handle) -> Exit:
        proc = self._children.get(handle.activation_id)
        host_dir = Path(str(handle.data["dir"]))
        if proc is not None:
            code = await proc.wait()
            self._children.pop(handle.activation_id, None)
        else:  # found again after a restart: not our child, so poll
            pid, started = int(handle.sandbox_id), handle.data.get("start_time")
            while _start_time(pid) is not None and _start_time(pid) == started:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            code = 0
        recorded = _read_exit(host_dir)
        if recorded is None:
            # The process watched is bubblewrap's outer one, which a stop's SIGTERM ends at
            # once; the sandbox's namespace lives on while its runner finishes (and records its
            # code): the end is when nothing of the group is left — `cancel` sees to that.
            await self._while_group_lives(int(handle.sandbox_id))
            recorded = _read_exit(host_dir)
        killed = 128 + signal.SIGKILL  # as the shell records a runner killed by SIGKILL
        if recorded is not None and recorded != killed:
            return Exit(recorded)
        if await self._out_of_memory(handle.activation_id):
            # The kernel killed the runner at its cgroup's memory limit: the same work would
            # need the same memory again — not retried as a failure that may pass.
            return Exit(recorded, "oom", "the runner was killed at its memory limit")
        if recorded is not None:
            return Exit(recorded)
        if code != 0:
            return Exit(None, "killed", f"signal {-code}" if code < 0 else f"shell exit {code}")
        return Exit(None, "lost", "the runner left no exit code")

    async def _out_of_memory(self, activation_id: str) -> bool:
        if self._cgroups is None:
            return False
        return await asyncio.to_thread(self._cgroups.oom_kills, activation_id) > 0

    @staticmethod
    async def _while_group_lives(group: int) -> None:
        while await asyncio.to_thread(_group_alive, group):  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(0.2)

    async def cancel(self, handle: Handle) -> None:
        """SIGTERM to the sandbox's process group, SIGKILL to what is left of it after the
        grace. The group outlives its leader (the shell, or bubblewrap's outer process, dies
        at once): it is done when no live member is left — with bubblewrap, the namespace's
        PID 1 stays a member until the namespace, and all in it, is gone."""
        pid = int(handle.sandbox_id)
        now = _start_time(pid)
        # Gone, or the pid is someone else's now — unless its group lives on without its
        # leader (bubblewrap's outer process, ended by an earlier stop): a group's id is not
        # given to another while it has members, so that group is still this one.
        recorded = handle.data.get("start_time")
        if now != recorded and (
            now is not None or recorded == GONE or not await asyncio.to_thread(_group_alive, pid)
        ):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        # Each look walks all of /proc: off the loop, as everywhere here (on a host with
        # thousands of processes one takes long enough to stall every other watch).
        for _ in range(int(self._settings.stop_grace_seconds / 0.1)):
            if not await asyncio.to_thread(_group_alive, pid):
                return
            await asyncio.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:
        """The process is gone already; what its group still holds (its leader killed alone:
        a sandbox's PID 1 and all under it) is killed whatever the policy. Then the policy
        says: the activation's directory (input, workspace, `runner.log`, record) is removed
        now, or kept — as the docker backend keeps a container — for a person to look at, and
        found again by `list_live` until the workspace retention removes it."""
        pid = int(handle.sandbox_id)
        # A group's id is not given to another while it has members, so a group left behind
        # by a leader that is gone is still this sandbox's.
        if _start_time(pid) is None and await asyncio.to_thread(_group_alive, pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        # And what left the group (`setsid`) but not the cgroup; before the directory goes:
        # a cgroup whose activation's directory is gone is swept only when empty.
        await self._remove_cgroup(handle.activation_id)
        host_dir = Path(str(handle.data["dir"]))
        policy = self._settings.cleanup
        if policy == "never" or (policy == "on_success" and not succeeded):
            log.info("process.kept", activation=handle.activation_id, dir=str(host_dir))
            return
        # rmtree removes links the sandbox left there and never follows them (no writes
        # through `workspace/session` or a planted one: the session's directory stays).
        await asyncio.to_thread(shutil.rmtree, host_dir, ignore_errors=True)
        if not await asyncio.to_thread(host_dir.exists):
            # (One the sandbox made impossible to remove keeps its record: else a record it
            # planted there, as a release before `RECORDS` kept them, would be the one read.)
            self._record_path(handle.activation_id).unlink(missing_ok=True)

    def _record_path(self, activation_id: str) -> Path:
        return self._records / f"{activation_id}.json"

    async def _remove_cgroup(self, activation_id: str) -> None:
        self._containment()
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.remove, activation_id)

    async def list_live(self) -> list[Handle]:
        found: list[Handle] = []
        self._containment()
        if self._cgroups is not None:  # left by an orchestrator killed in a cleanup
            keep = set(self._children)
            with contextlib.suppress(OSError):
                keep.update(p.name for p in self._root.iterdir())
            await asyncio.to_thread(self._cgroups.sweep, keep)
        if not self._root.exists():
            return found
        records: dict[str, Path] = {}
        if self._records.is_dir():
            for path in self._records.glob("*.json"):
                if (self._root / path.stem).is_dir():
                    records[path.stem] = path
                else:  # its directory was removed (the retention's sweep of kept ones)
                    path.unlink(missing_ok=True)
        # An orchestrator before the records' own directory wrote them into the activation's
        # (its runners may still run): read there only for those without a record here.
        for legacy in self._root.glob(f"*/{RECORD}"):
            records.setdefault(legacy.parent.name, legacy)
        for activation_id, record_path in sorted(records.items()):
            handle = self._listed(activation_id, record_path)
            if handle is not None:
                found.append(handle)
        return found

    def _listed(self, activation_id: str, record_path: Path) -> Handle | None:
        try:
            record = json.loads(_read_own(record_path))
        except (OSError, ValueError):
            return None
        # One that is not as launch wrote it (a pid that is no number would fail every
        # listing, so the reconciliation) or that names another activation is refused; only
        # what launch wrote is taken (a legacy record, in the sandbox's reach, could hold more).
        if not _well_formed(record, activation_id):
            log.warning("process.record_refused", record=str(record_path))
            return None
        pid, started = int(record["pid"]), record.get("start_time")
        alive = _start_time(pid) == started
        data = {
            "pid": pid,
            "start_time": started,
            "activation_id": activation_id,
            "dir": str(self._root / activation_id),
            "status": "running" if alive else "exited",
        }
        return Handle(activation_id, NAME, str(pid), data, finished=not alive)

    async def release(self) -> None:
        return  # its children are this host's: the next leader here watches them again

    async def health(self) -> Health:
        problem = await self._isolation_problem()
        detail: dict[str, object] = {"isolation": "bwrap" if self._bwrap else "none"}
        detail["limits"] = self._containment().detail()
        if problem is not None:
            detail["isolation_problem"] = problem
        return Health(ok=problem is None, detail=detail)

    async def close(self) -> None:
        # Its sandboxes live on for the next leader; an empty tree of its own does not.
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.release)


def _open_own(path: Path, flags: int, mode: int = 0o600) -> int:
    """A file of the activation's directory, opened (made if missing) without following a
    link: the directory is bound writable into an isolated sandbox, which may have put one
    there to make this process write a host file."""
    # O_NONBLOCK: a FIFO put there fails to open (no reader) instead of hanging the loop.
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _write_own(path: Path, data: bytes, mode: int) -> None:
    fd = _open_own(path, os.O_WRONLY | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as sink:
        sink.write(data)


def _well_formed(record: object, activation_id: str) -> bool:
    if not isinstance(record, dict) or record.get("activation_id") != activation_id:
        return False
    pid, started = record.get("pid"), record.get("start_time")
    number = isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31
    return number and (started is None or type(started) is int)


def _group_alive(group: int) -> bool:
    """Whether a live process is left in the process group: a zombie counts as a member for
    `killpg(…, 0)`, so /proc is read — only when that says the group has members at all."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # members we may not signal: still members
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[2]) == group:
            return True
    return False


def _read_own(path: Path, limit: int = 65_536) -> bytes:
    """At most `limit` bytes of a file of the activation's directory, read without following
    a link and only if it is a regular file: the sandbox may have put a FIFO there (a read
    would block the event loop forever) or a link to anything (`/dev/zero`: an endless one)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _read_exit(host_dir: Path) -> int | None:
    try:
        return int(_read_own(host_dir / EXIT_FILE, 64).strip())
    except (OSError, ValueError):
        return None
