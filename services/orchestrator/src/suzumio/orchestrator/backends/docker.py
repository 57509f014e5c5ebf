"""The docker backend: one container per activation through the Docker Engine API (DESIGN.md §8).

A container gets the input file read-only at `/activation/input.json`, the activation's
workspace at `/workspace`, the session's directory at `/workspace/session`, the granted mounts,
the plan's environment and labels naming the project, agent, session and activation. It runs
as a non-root numeric user (the configured one when the orchestrator is root, else the
orchestrator's own: the files it is given stay private to it either way) with no capabilities,
no privilege escalation, a read-only root filesystem (a tmpfs `/tmp`), pids/memory/CPU limits
and the network of its profile: `none` (no interface but loopback; the tool-broker's Unix socket
mounted at `/activation/broker.sock`, the broker's model relay its model), or for
`egress`/`full` the configured network, else the
engine's bridge, with `host.docker.internal` mapped to the host gateway (loopback broker URLs
are rewritten to it). Only on an engine without a bridge does it fall back to the host's
network (then the sandbox reaches the tool-broker on 127.0.0.1 — and everything else on the
host's loopback), with a warning in the log and in `health`.

Bind sources are paths on the engine's host: an orchestrator that itself runs in a container
must see its data directory at the same path as the engine does. The disk limit of a profile
bounds `/tmp` only; the workspace lives on the host's disk.

Every engine call runs in this backend's own thread pool, off the event loop; `watch` waits in
short slices so a cancelled watch frees its thread soon.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import docker  # type: ignore[import-untyped]
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound  # type: ignore[import-untyped]
from docker.types import Mount  # type: ignore[import-untyped]

from suzumio.orchestrator.backends.base import (
    INPUT_PATH,
    INSTALLATION_LABEL,
    LABEL_PREFIX,
    OFFLINE_BROKER_URL,
    WORKSPACE,
    Exit,
    Handle,
    Health,
    LaunchError,
    LaunchPlan,
    labels_for,
    of_another_installation,
)
from suzumio.orchestrator.backends.docker_settings import (
    HOST_FALLBACK,
    SANDBOX_TMP,
    DockerSettings,
    Networks,
    Owner,
    check_mounts,
    choose_networks,
    give_tree,
    private_mode,
    sandbox_owner,
    via_gateway,
)
from suzumio.platform.logging import get_logger

__all__ = ["DockerBackend", "DockerSettings"]
log = get_logger(__name__)
NAME = "docker"
SESSION_TARGET = f"{WORKSPACE}/session"
BROKER_SOCKET_TARGET = "/activation/broker.sock"
HASH_LABEL = f"{LABEL_PREFIX}.content-hash"  # set by tools/runner_image.py
# Of `labels_for`'s labels, what a handle carries (a container also inherits its image's).
HANDLE_LABELS = ("namespace", "project", "agent", "session", "activation", "attempt")
WAIT_SLICE_SECONDS = 5
_STOPPED = frozenset({"exited", "dead", "removing"})  # a container's states with nothing to stop
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")
T = TypeVar("T")


def _own(root: Path, owner: Owner) -> None:
    """Make `root` and everything in it the sandbox user's: handed to it when we are root, else
    (it runs as us) kept ours, writable by us and by nobody else. Never through a link: another
    activation of the session may be running and swapping entries for links as we walk."""
    give_tree(root, (owner.uid, owner.gid) if owner.chown else None, private_mode)


def _state_exit(state: dict[str, Any], cancelled: bool) -> Exit:
    status = state.get("Status", "")
    code = state.get("ExitCode")
    detail = f"status {status}, exit code {code}" + (
        f": {state['Error']}" if state.get("Error") else ""
    )
    if status == "created":  # never started
        return Exit(None, "lost", detail)
    if status in {"dead", "removing"}:  # removed under it: the code is the removal's kill
        return Exit(None, "lost", detail, gone=True)
    if state.get("OOMKilled"):
        return Exit(None if code is None or code >= 128 else code, "oom", detail)
    signalled = code is None or code >= 128
    if cancelled:
        return Exit(None if signalled else code, "cancelled", detail)
    if signalled:
        return Exit(None, "killed", detail)
    return Exit(code, "exited", detail)


OOM_SETTLE_SECONDS = 1.0
OOM_SETTLE_STEP_SECONDS = 0.1


def settled_state(
    inspect: Callable[[], dict[str, Any]], sleep: Callable[[float], None]
) -> dict[str, Any]:
    """The `State` of an exited container, its OOM flag given time to arrive. On cgroup v2 the
    engine may handle the runtime's exit event before its OOM event (fixed in containerd only
    in 2025: containerd#12714): a container killed at its memory limit then reads as killed
    by SIGKILL (137), `OOMKilled` false, for a moment. One that was, and had a memory limit,
    is inspected again for up to `OOM_SETTLE_SECONDS` (in the watch's thread) before its
    exit is taken as a kill."""
    container = inspect()
    state: dict[str, Any] = container["State"]
    if not (container.get("HostConfig") or {}).get("Memory"):
        return state
    for _ in range(round(OOM_SETTLE_SECONDS / OOM_SETTLE_STEP_SECONDS)):
        if state.get("OOMKilled") or state.get("ExitCode") != 137:
            break
        sleep(OOM_SETTLE_STEP_SECONDS)
        state = inspect()["State"]
    return state


def _redact(text: str, plan: LaunchPlan) -> str:
    for key in plan.secret_keys:
        value = plan.env.get(key)
        if value:
            text = text.replace(value, "***")
    return text


PULL_THREADS = 4  # pulls at once (more wait their turn, within their launch's time)


class _ImageMissingError(Exception):
    """The engine lacks the image: it is pulled (off the launch's thread), then created."""


class _AbandonedError(Exception):
    """The launch was given up while its thread worked: nobody waits for its container."""


class DockerBackend:
    name = NAME

    def __init__(
        self,
        settings: DockerSettings | None = None,
        namespace: str = "",
        installation: str | None = None,
    ) -> None:
        self._settings = settings or DockerSettings()
        self._namespace = namespace
        self._installation = installation
        self._ns_label = namespace or "-"
        self._owner = sandbox_owner(self._settings.user, os.geteuid(), os.getegid())
        self._networks: Networks | None = None  # asked of the engine once
        self._pool = ThreadPoolExecutor(self._settings.max_threads, thread_name_prefix="docker")
        # Each running container's wait holds a thread and a connection for 5 s at a time,
        # over and over: on the calls' own pool, 32 running containers left a launch or a
        # stop queued behind their waits for as long as they ran.
        self._waits = ThreadPoolExecutor(self._settings.max_waits, thread_name_prefix="docker-wait")
        # Pulls have no time limit in docker-py (a stalled registry holds its thread for as
        # long as the engine waits): on threads of their own, waited for a bounded time, so
        # they never take the threads every stop, listing and launch needs.
        self._pulls = ThreadPoolExecutor(PULL_THREADS, thread_name_prefix="docker-pull")
        self._wait_api: Any = None
        self._api: Any = None
        self._api_lock = threading.Lock()
        self._wait_api_lock = threading.Lock()
        self._cancelled: set[str] = set()

    # -- plumbing ---------------------------------------------------------------------------
    def _client(self) -> Any:
        with self._api_lock:
            if self._api is None:  # connects (and negotiates the API version) on first use
                self._api = self._new_client(self._settings.max_threads)
            return self._api

    def _wait_client(self) -> Any:
        with self._wait_api_lock:  # (its first use asks the engine: not under the calls' lock)
            if self._wait_api is None:
                self._wait_api = self._new_client(self._settings.max_waits)
            return self._wait_api

    def _new_client(self, connections: int) -> Any:
        return docker.APIClient(
            base_url=self._settings.base_url,
            version="auto",
            timeout=self._settings.api_timeout_seconds,
            max_pool_size=connections,
        )

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._call_on(self._pool, fn, *args)

    @staticmethod
    async def _call_on(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, functools.partial(ctx.run, fn, *args))

    # -- launch -----------------------------------------------------------------------------
    async def launch(self, plan: LaunchPlan) -> Handle:
        image = plan.profile.image or self._settings.image
        # Set when this launch is given up (its leader stepped down and cancelled it): its
        # thread goes on, and must then not remove a container of the same name that a new
        # leader's launch made, nor start its own.
        abandoned = threading.Event()
        try:
            network = (await self._call(self._network_choice)).of(plan.profile.network)
            try:
                container_id = await self._call(self._launch_sync, plan, image, network, abandoned)
            except _ImageMissingError:
                await self._pull(image)
                try:
                    container_id = await self._call(
                        self._launch_sync, plan, image, network, abandoned
                    )
                except _ImageMissingError:  # removed again meanwhile (a prune, an `rmi`)
                    raise LaunchError(f"image {image} was removed as it was pulled") from None
        except asyncio.CancelledError:
            abandoned.set()
            raise
        except LaunchError:
            raise
        except (DockerException, requests.RequestException, OSError) as exc:
            message = _redact(f"docker: {exc}", plan)
            log.warning("docker.launch_failed", activation=plan.activation_id, error=message)
            raise LaunchError(message, retryable=not _client_error(exc)) from None
        log.info(
            "docker.launched",
            activation=plan.activation_id,
            container=container_id[:12],
            image=image,
            network=network,
            env=plan.redacted_env(),
        )
        labels = labels_for(plan, self._namespace, self._installation)
        return self._handle(container_id, self._name(plan), "running", labels)

    def _network_choice(self) -> Networks:
        with self._api_lock:
            if self._networks is not None:
                return self._networks
        found = {str(n.get("Name")) for n in self._client().networks()}
        networks = choose_networks(self._settings, found)
        with self._api_lock:
            if self._networks is None and networks.host_fallback:
                log.warning("docker.host_network_fallback", detail=HOST_FALLBACK)
            self._networks = networks
        return networks

    def _launch_sync(
        self, plan: LaunchPlan, image: str, network: str, abandoned: threading.Event
    ) -> str:
        if abandoned.is_set():
            raise _AbandonedError
        # In the call's thread, as close to the bind as it gets: a source on a stalled network
        # filesystem held the orchestrator's event loop while its path was resolved.
        check_mounts(plan)
        self._prepare(plan, network)
        if abandoned.is_set():  # given up while it prepared: the name is not to be taken
            raise _AbandonedError
        api = self._client()
        container_id, adopted = self._create_or_adopt(api, plan, image, network, abandoned)
        if adopted:
            return container_id
        if abandoned.is_set():
            _remove_quietly(api, container_id)  # its own: made by this thread
            raise _AbandonedError
        try:
            api.start(container_id)
        except NotFound:
            # Removed before it started: another launch of the same attempt took its name
            # (a leader's, racing one that stepped down). Not this plan's fault: try again.
            raise LaunchError(
                "the container was removed before it started (another launch of the attempt)"
            ) from None
        except (DockerException, requests.RequestException):
            # Whatever went wrong: a start whose answer was lost (a read timeout) may have
            # started it, and a failed launch must leave nothing running that nobody watches.
            _remove_quietly(api, container_id)
            raise
        return container_id

    def _create_or_adopt(
        self, api: Any, plan: LaunchPlan, image: str, network: str, abandoned: threading.Event
    ) -> tuple[str, bool]:
        """The container made for the plan, or one of its name that runs it already (True)."""
        name = self._name(plan)
        try:
            return self._create(api, plan, image, name, network), False
        except ImageNotFound:
            raise _ImageMissingError(image) from None
        except APIError as exc:
            if exc.status_code != 409:
                raise
            if abandoned.is_set():  # the name's container may be a new leader's launch
                raise _AbandonedError from None
        except requests.RequestException:
            # Its answer lost (a read timeout): the engine may have made it, the plan's keys
            # in its env, and the next attempt has another name — nothing removed it before
            # the next takeover's reconciliation.
            _remove_quietly(api, name)
            raise
        adopted = self._adopt(api, name, plan)
        if adopted is not None:
            return adopted, True
        return self._create(api, plan, image, name, network), False

    def _prepare(self, plan: LaunchPlan, network: str) -> None:
        workspace = plan.host_dir / "workspace"
        for d in (workspace / "out", workspace / "session", plan.session_dir):
            d.mkdir(parents=True, exist_ok=True)
        update: dict[str, Any] = {"workspace": WORKSPACE}
        if network == "none":
            if plan.broker_socket is None:
                raise LaunchError(
                    "network 'none' without the broker's socket (SUZUMIO_BROKER_SOCKET)",
                    retryable=False,
                )
            update |= {
                "controller_url": OFFLINE_BROKER_URL,
                "controller_socket": BROKER_SOCKET_TARGET,
            }
        elif network != "host":
            update["controller_url"] = via_gateway(plan.input.controller_url)
        path = plan.host_dir / "input.json"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:  # the token is in it: readable by the sandbox only
            f.write(plan.input.model_copy(update=update).model_dump_json())
        if self._owner.chown:
            os.chown(path, self._owner.uid, self._owner.gid)
        _own(workspace, self._owner)
        _own(plan.session_dir, self._owner)

    def _create(self, api: Any, plan: LaunchPlan, image: str, name: str, network: str) -> str:
        limits = plan.profile.limits
        mounts = [
            Mount(INPUT_PATH, str(plan.host_dir / "input.json"), type="bind", read_only=True),
            Mount(WORKSPACE, str(plan.host_dir / "workspace"), type="bind"),
            Mount(SESSION_TARGET, str(plan.session_dir), type="bind"),
            *(
                Mount(m.target, str(m.host_path), type="bind", read_only=not m.writable)
                for m in plan.mounts
            ),
        ]
        if network == "none" and plan.broker_socket is not None:
            # The socket itself, not its directory (which may hold anything). A broker
            # restarted meanwhile makes a new one, which this container then does not see: its
            # runner's calls fail and the attempt is retried.
            mounts.append(
                Mount(BROKER_SOCKET_TARGET, str(plan.broker_socket), type="bind", read_only=True)
            )
        tmp_mb = min(self._settings.tmp_mb, limits.disk_mb)
        host_config = api.create_host_config(
            mounts=mounts,
            tmpfs={SANDBOX_TMP: f"rw,nosuid,nodev,size={tmp_mb}m,mode=1777"},
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=limits.pids,
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",
            nano_cpus=int(limits.cpus * 1_000_000_000),
            network_mode=network,
            extra_hosts=None
            if network in {"host", "none"}
            else {"host.docker.internal": "host-gateway"},
            init=self._settings.init,
        )
        created = api.create_container(
            image,
            command=list(plan.profile.entry) or None,
            name=name,
            user=self._owner.user,
            environment=[f"{k}={v}" for k, v in plan.env.items()],
            labels={**plan.labels, **labels_for(plan, self._namespace, self._installation)},
            working_dir=WORKSPACE,
            host_config=host_config,
        )
        return str(created["Id"])

    def _adopt(self, api: Any, name: str, plan: LaunchPlan) -> str | None:
        """A container of this name exists (a launch repeated after a crash): keep it if it
        runs this activation, else remove it so the attempt starts afresh."""
        try:
            info = api.inspect_container(name)
        except NotFound:  # removed meanwhile (the launch that made it failed): the name is free
            return None
        labels = info["Config"].get("Labels") or {}
        if (
            info["State"].get("Running")
            and labels.get(f"{LABEL_PREFIX}.activation") == plan.activation_id
        ):
            return str(info["Id"])
        with contextlib.suppress(NotFound):  # removed meanwhile by the launch that made it
            api.remove_container(info["Id"], force=True)
        return None

    async def _pull(self, image: str) -> None:
        if not self._settings.pull_missing:
            raise LaunchError(f"image {image} is not on the engine", retryable=False)
        seconds = self._settings.pull_timeout_seconds
        try:
            await asyncio.wait_for(self._call_on(self._pulls, self._pull_sync, image), seconds)
        except TimeoutError:
            # Its thread goes on until the engine ends the pull; the next attempt may find the
            # image there, or pull again.
            raise LaunchError(f"pulling image {image} took more than {seconds:g} s") from None

    def _pull_sync(self, image: str) -> None:
        """Pull `image`. Its failure is for good only where the registry said the image is
        not there (or not to be had, or not a name): a registry away, slow or refusing for
        now (`toomanyrequests`, a 5xx) fails the launch retryable, as the pull's time
        limit does — before, any failure to pull failed the activation for good."""
        api = self._client()
        try:
            output = api.pull(image)
        except DockerException as exc:
            status = exc.status_code if isinstance(exc, APIError) else None
            raise _pull_failed(image, str(exc), status) from None
        try:
            api.inspect_image(image)
        except DockerException as exc:  # a pull can fail inside its stream without raising
            said = _stream_error(output)
            if said is None:  # no word of the registry's (a pull cut short): not for good
                raise LaunchError(
                    f"image {image} is not on the engine after its pull: {exc}"[:2_000]
                ) from None
            raise _pull_failed(image, said, None) from None

    def _name(self, plan: LaunchPlan) -> str:
        ns = _NAME_UNSAFE.sub("-", self._namespace).strip("-.")
        return "-".join(p for p in ("suzumio", ns, plan.activation_id, str(plan.attempt)) if p)

    def _handle(self, container_id: str, name: str, status: str, labels: dict[str, str]) -> Handle:
        """Named by the container's id; `data` carries its name, status and our labels (the
        ids of the project, agent, session and activation, the attempt, the namespace)."""
        ours = {k: labels[f"{LABEL_PREFIX}.{k}"] for k in HANDLE_LABELS}
        data = {**ours, "name": name, "status": status}
        return Handle(ours["activation"], NAME, container_id, data, finished=status in _STOPPED)

    # -- watch, cancel, cleanup -------------------------------------------------------------
    async def watch(self, handle: Handle) -> Exit:
        unreachable_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            try:
                state = await self._call_on(self._waits, self._wait_slice, handle.sandbox_id)
            except NotFound:  # its exit code with it: a recorded output says how it ended
                return Exit(None, "lost", "the container is gone", gone=True)
            except (DockerException, requests.RequestException, OSError) as exc:
                # Any failure to hear the engine (a wait's body cut midway is requests'
                # ChunkedEncodingError, no ConnectionError): out of reach for a moment, and
                # the container may well run on (an engine restarted with live-restore).
                unreachable_since = unreachable_since or loop.time()
                if loop.time() - unreachable_since > self._settings.lost_after_seconds:
                    return Exit(None, "lost", f"engine unreachable: {exc}")
                await asyncio.sleep(1.0)
                continue
            unreachable_since = None
            if state is not None:
                return _state_exit(state, handle.sandbox_id in self._cancelled)

    def _wait_slice(self, container_id: str) -> dict[str, Any] | None:
        api = self._wait_client()
        try:
            api.wait(container_id, timeout=WAIT_SLICE_SECONDS)
        except requests.exceptions.ReadTimeout:
            return None
        except requests.ConnectionError as exc:  # a read timeout on a unix socket looks so
            if "timed out" in str(exc).lower():
                return None
            raise
        if container_id in self._cancelled:  # stopped by us: its SIGKILL is ours, no OOM's
            state: dict[str, Any] = api.inspect_container(container_id)["State"]
            return state
        return settled_state(lambda: api.inspect_container(container_id), time.sleep)

    async def cancel(self, handle: Handle) -> None:
        self._cancelled.add(handle.sandbox_id)
        try:
            await self._call(self._stop, handle.sandbox_id)
        except NotFound:
            return
        log.info(
            "docker.cancelled", activation=handle.activation_id, container=handle.sandbox_id[:12]
        )

    def _stop(self, container_id: str) -> None:
        try:
            self._client().stop(container_id, timeout=self._settings.stop_grace_seconds)
        except APIError as exc:
            if exc.status_code != 409:  # 409: already being removed
                raise

    async def cleanup(self, handle: Handle, succeeded: bool) -> None:
        policy = self._settings.cleanup
        if policy == "never" or (policy == "on_success" and not succeeded):
            # Kept for a person to look at, never kept running: an attempt that ended while
            # its container lived on (the engine out of reach until the watch gave up) would
            # run beside its retry. A container that exited is not touched by the stop; an
            # engine still out of reach fails the cleanup, and the stop is asked again.
            with contextlib.suppress(NotFound):
                await self._call(self._stop, handle.sandbox_id)
            self._cancelled.discard(handle.sandbox_id)  # its end is told: nothing asks again
            log.info(
                "docker.kept", activation=handle.activation_id, container=handle.sandbox_id[:12]
            )
            return
        try:
            await self._call(self._remove, handle.sandbox_id)
        finally:
            self._cancelled.discard(handle.sandbox_id)

    def _remove(self, container_id: str) -> None:
        try:
            self._client().remove_container(container_id, v=True, force=True)
        except NotFound:
            return
        except APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise

    # -- reconciliation, health -------------------------------------------------------------
    async def list_live(self) -> list[Handle]:
        found = await self._call(self._list)
        return [
            self._handle(c["Id"], (c.get("Names") or ["/"])[0].lstrip("/"), c["State"], c["Labels"])
            for c in found
        ]

    def _list(self) -> list[dict[str, Any]]:
        wanted = [f"{LABEL_PREFIX}.managed=true", f"{LABEL_PREFIX}.namespace={self._ns_label}"]
        found: list[dict[str, Any]] = self._client().containers(all=True, filters={"label": wanted})
        # Another installation on this engine that kept the same namespace is not ours: taken
        # for orphans, its containers were stopped at every takeover here.
        return [
            c
            for c in found
            if all(f"{LABEL_PREFIX}.{k}" in (c.get("Labels") or {}) for k in HANDLE_LABELS)
            and not of_another_installation(
                (c.get("Labels") or {}).get(INSTALLATION_LABEL), self._installation
            )
        ]

    async def release(self) -> None:
        # A cancel is sent again by whichever replica leads next (it is in the log).
        self._cancelled.clear()

    async def health(self) -> Health:
        try:
            detail = await self._call(self._health)
        except (DockerException, requests.RequestException) as exc:
            return Health(ok=False, detail={"engine": "unreachable", "error": str(exc)[:500]})
        return Health(ok=bool(detail["image_present"]), detail=detail)

    def _health(self) -> dict[str, Any]:
        api = self._client()
        api.ping()
        version = api.version()
        networks = self._network_choice()
        detail: dict[str, Any] = {
            "engine": "reachable",
            "server_version": version.get("Version"),
            "api_version": api.api_version,
            "image": self._settings.image,
            "image_present": False,
            "network": {"egress": networks.egress, "full": networks.full},
            "user": self._owner.user,
        }
        if networks.host_fallback:
            detail["warning"] = HOST_FALLBACK
        try:
            image = api.inspect_image(self._settings.image)
        except ImageNotFound:
            return detail
        labels = image.get("Config", {}).get("Labels") or {}
        detail.update(image_present=True, image_id=image["Id"], content_hash=labels.get(HASH_LABEL))
        return detail

    async def close(self) -> None:
        for api in (self._api, self._wait_api):
            if api is not None:
                await self._call(api.close)
        self._api = self._wait_api = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._waits.shutdown(wait=False, cancel_futures=True)
        self._pulls.shutdown(wait=False, cancel_futures=True)


def _remove_quietly(api: Any, container_id: str) -> None:
    with contextlib.suppress(DockerException, requests.RequestException):
        api.remove_container(container_id, force=True)


# What a registry (through the engine) says of an image that is not to be had, however often
# it is asked: none of that name or tag, no access to it, not a valid name.
_PULL_FOR_GOOD = (
    "manifest unknown",
    "not found",
    "does not exist",
    "pull access denied",
    "unauthorized",
    "invalid reference",
)


def _pull_failed(image: str, detail: str, status: int | None) -> LaunchError:
    for_good = status is not None and 400 <= status < 500 and status not in {408, 409, 429}
    for_good = for_good or (
        (status is None or status < 500)
        and any(words in detail.lower() for words in _PULL_FOR_GOOD)
    )
    return LaunchError(
        f"image {image} is not on the engine and could not be pulled: {detail}"[:2_000],
        retryable=not for_good,
    )


def _stream_error(output: object) -> str | None:
    """The error a pull's stream of JSON lines ended with, if it says one."""
    text = output.decode(errors="replace") if isinstance(output, bytes) else str(output or "")
    for line in reversed(text.splitlines()):
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict) and item.get("error"):
                return str(item["error"])
    return None


def _client_error(exc: BaseException) -> bool:
    """An engine's 4xx (bad image name, bad mount, …) will not succeed when tried again."""
    return isinstance(exc, APIError) and exc.is_client_error() and exc.status_code != 409
