"""Warm runners for the worker: a fork server that has imported the runner once and forks a
fresh process per activation, so an activation does not pay for a Python start and the
imports (about a second of CPU) before its first model call.

Each child is still a sandbox of its own: a new session and process group, its cgroup and
rlimits (`suzumio.runner.limits`, the request's `sandbox`), the dispatch's environment only,
its own working directory, stdin closed, output to its log, the parent-death signal set; it
runs `suzumio.runner.main.run` and exits with its code. The server is single-threaded
(forking a threaded process is unsafe) and reports each child's exit.

**Resident runners** (for warm sessions): a child forked with `"resident": true` does not run
one activation and exit; it serves the activations the worker sends it, one at a time — the
same process for a session's next activations, so they pay neither the fork nor the exit, and
its HTTP connections stay open. It leaves after `max_runs` activations, or when the worker
retires it (another agent or environment, an activation stopped, the session no longer warm).
Its two pipes are the worker's: the worker makes them and hands the runner's ends to the
server (over a Unix socket, `SCM_RIGHTS`), which passes them on to the child and closes its
copies. The worker writes each activation's request to the runner and reads its end from it
directly: the server, single-threaded, is not woken twice per activation to relay them (until
2026-12-04 it was, and parsed and wrote each request again — its session's history).

Protocol on the server's stdin/stdout, one JSON object per line. Once warm (everything
imported, a model and a broker call made on loopback) it says `{"ready": true}`, and only then
reads requests:
`{"id", "input", "cwd", "log", "env", "sandbox"?}` → `{"id", "pid"}` or `{"id", "error"}`;
`{"id", "resident": true, "cwd", "log", "env", "max_runs", "sandbox"?}` (its pipes' ends sent
first on the socket, with the request's id) → `{"id", "pid"}` or `{"id", "error"}`; and
`{"pid", "code"}` when a child ends (`code` < 0: killed by signal `-code`).
On a resident runner's pipes: `{"id", "spec", "cwd", "env"}` in (an activation, its input
inline: no file holds its token) → `{"id", "done": code, "tail"?}` out when it ended there
(`tail`: the end of what it logged, if it failed). The lines are written and read with
orjson: an activation's input (its session's history) is most of their bytes, and `json`
took several times longer over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import random
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from suzumio.runner import eventloop, strays
from suzumio.runner.limits import Sandbox
from suzumio.runner.log import log

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
# How long the worker waits for a new server to be warm before it goes on without it (runs
# then wait for it as they always could): the imports and warm-up take ~1-4 s of CPU.
READY_SECONDS = 120.0
FORK_ANSWER_SECONDS = 30.0  # how long a start waits for the server to name its process


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _child(
    request: dict[str, Any], inherited: list[int], control: tuple[int, int] | None = None
) -> None:
    """In the forked child: become the sandbox, run the activation (or, resident, those that
    come through `control`: requests in, replies out), never return."""
    code = 1
    try:
        os.setsid()
        libc = _libc()
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # Its cgroup and rlimits before it runs anything: all it starts inherits them.
        Sandbox.from_json(request.get("sandbox") or {}).apply()
        child_signals()
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()
        from suzumio.runner.main import run, serve_resident  # noqa: PLC0415 - a lookup

        if control is None:
            code = run(Path(request["input"]))
        else:
            max_runs = int(request.get("max_runs", 1))
            code = serve_resident(*control, max_runs=max_runs, log_path=Path(request["log"]))
    except BaseException as exc:  # the child must exit, whatever happened
        with contextlib.suppress(Exception):
            sys.stderr.write(f"forkserver child failed: {exc!r}\n")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def child_signals() -> None:
    """A forked runner's signals as a runner started afresh has them: SIGCHLD, SIGTERM and
    SIGINT to their defaults (the fork server's own handlers are not its), SIGPIPE ignored as
    Python ignores it. asyncio and uvloop write to sockets with no MSG_NOSIGNAL: with SIGPIPE
    at its default, a write to a connection the far end reset (a model request on a kept
    connection a proxy closed) killed the runner — a warm one with all its session's state —
    where it should have been an error, retried. (The commands it runs get the defaults back
    from subprocess and libuv.)"""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


STRAY_SWEEP_SECONDS = 10.0

_WARM_CHUNKS = (
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_0",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ]
                },
                "finish_reason": "tool_calls",
            }
        ]
    },
    {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
)


async def _answer_warm_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A canned model stream or broker reply, for `_warm_up` only."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
         if line.startswith(b"content-length:")),
        0,
    )  # fmt: skip
    await reader.readexactly(length)
    if b"/chat/completions" in head.split(b"\r\n", 1)[0]:
        common = {"id": "warm", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        body = b"".join(
            b"data: " + json.dumps({**common, **chunk}).encode() + b"\n\n" for chunk in _WARM_CHUNKS
        )
        body += b"data: [DONE]\n\n"
        kind = b"text/event-stream"
    else:
        body, kind = b'{"recorded": true}', b"application/json"
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )  # fmt: skip
    await writer.drain()
    writer.close()


async def _warm_up() -> None:
    """One model call and one broker call through a runner's own clients and through a
    resident runner's kept ones, against a canned server on loopback: everything they import
    or build lazily on first use (the transport modules, the SDK's cached response validators)
    is then made here once, not in every runner."""
    from suzumio.contracts.broker import HistoryEntryIn  # noqa: PLC0415
    from suzumio.contracts.values import ModelSpec  # noqa: PLC0415
    from suzumio.runner.broker import BrokerClient  # noqa: PLC0415
    from suzumio.runner.connections import Connections  # noqa: PLC0415
    from suzumio.runner.model import Endpoint, ModelClient  # noqa: PLC0415

    server = await asyncio.start_server(_answer_warm_up, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    endpoint = Endpoint(f"{url}/v1", "warm-up")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    kept = Connections()
    try:
        for clients in (None, kept):
            http = clients.broker(url, 5) if clients else None
            broker = BrokerClient(url, "warm-up", retries=0, timeout=5, http=http)
            with contextlib.suppress(Exception):
                entry = HistoryEntryIn(message_id="w" * 26, role="assistant")
                await broker.append_history([entry])
            await broker.aclose()
            model = ModelClient(ModelSpec(name="warm-up"), endpoint, 5, kept=clients)
            with contextlib.suppress(Exception):
                await model.complete([{"role": "user", "content": "-"}], [tool], 16)
            await model.close()
    finally:
        await kept.aclose()
        server.close()
        await server.wait_closed()


def _complete_models() -> None:
    """Build every pydantic model whose build was deferred (forward references): otherwise
    each runner would build them again on first use, at tens of milliseconds apiece."""
    from pydantic import BaseModel  # noqa: PLC0415

    pending: list[type[BaseModel]] = [BaseModel]
    seen: set[type[BaseModel]] = set()
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                pending.append(sub)
        if cls is not BaseModel and not getattr(cls, "__pydantic_complete__", True):
            with contextlib.suppress(Exception):  # a generic or an unresolvable one: as before
                cls.model_rebuild()


def write_all(fd: int, data: bytes) -> None:
    """All of `data` to a blocking pipe: a write larger than the pipe's buffer may return
    short (a signal came while it waited for the reader), and the rest must follow."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _encoded(request: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(request) + b"\n"
    except TypeError as exc:  # a value JSON cannot hold (a path that is not UTF-8)
        raise OSError(f"the request cannot be encoded: {exc}") from None


def _is_done(answer: Any) -> bool:
    """Whether a resident runner's line is an activation's end: `{"id", "done", "tail"?}`."""
    return (
        isinstance(answer, dict)
        and type(answer.get("id")) is int
        and type(answer.get("done")) is int
        and isinstance(answer.get("tail", ""), str)
    )


class _Lines:
    """Whole lines out of the chunks read. A resident runner's request is one line as long as
    its dispatch (megabytes: the session's history): each chunk is looked through once, and
    kept in a buffer that grows in place — not joined to all that came before and searched
    again from its start, which took this single-threaded server a second for 8 MB and half
    a minute for 64, every start and end of the worker's other runners waiting meanwhile."""

    def __init__(self) -> None:
        self._partial = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        end = chunk.rfind(b"\n")
        if end < 0:
            self._partial += chunk
            return []
        self._partial += chunk[:end]
        lines = self._partial.split(b"\n")
        self._partial = bytearray(chunk[end + 1 :])
        return [bytes(line) for line in lines]


def _outlive_stop_signals() -> None:
    """The server ends with its worker (its requests' end, or the parent-death signal),
    never before: a Ctrl-C reaches the worker's whole process group, and the worker drains
    its runs on it — had the server died of it, its runners would have died with it. (Its
    children take the default handlers back in `_child`.)"""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The fork server's environment: the worker's, less the platform's settings — the NATS
    URL with its credentials among them. The server needs none (each runner gets the
    dispatch's environment), and a runner's commands could read the server's from
    /proc/<pid>/environ, through their runner's parent."""
    return {k: v for k, v in environ.items() if not k.startswith("SUZUMIO_")}


def serve() -> int:
    """The server's loop (`python -m suzumio.runner forkserver`)."""
    _outlive_stop_signals()
    import suzumio.runner.main  # noqa: F401, PLC0415 - the point: import it all once, here

    eventloop.run(_warm_up())  # and what the HTTP stacks import on their first request
    _complete_models()
    # Everything imported so far lives as long as the server: out of the collector's sight, a
    # child's collections do not touch (and so copy) the pages it shares with the server.
    gc.collect()
    gc.freeze()
    libc = _libc()
    if libc is not None:  # the worker's death ends the server, and with it its children
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # A runner's commands run as this server's user: none may read its memory or its
        # /proc/<pid>/environ (a runner forked here sets the same for itself).
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    strays.become_subreaper()  # what a runner killed outright leaves comes here: _reap ends it
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    requests = os.fdopen(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    replies = sys.stdout
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    lines = _Lines()
    pipes = _pipes_socket()
    inherited = [sys.stdin.fileno(), sys.stdout.fileno(), wake_r, wake_w]
    inherited += [pipes.fileno()] if pipes is not None else []

    def reply(body: dict[str, Any]) -> None:
        replies.write(json.dumps(body) + "\n")
        replies.flush()

    forked: set[int] = set()
    reply({"ready": True})
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(reply, forked)
                continue
            chunk = requests.read(1 << 20)
            if not chunk:
                return 0  # the worker is gone
            for line in lines.feed(chunk):
                _fork(orjson.loads(line), inherited, pipes, reply, selector, forked)
        _reap(reply, forked)


PIPES_FD_ENV = "FORKSERVER_PIPES_FD"
"""Names the server's end of the socket a resident runner's pipe ends come over."""
PIPES_WAIT_SECONDS = 5.0


def _pipes_socket() -> socket.socket | None:
    fd = os.environ.pop(PIPES_FD_ENV, "")
    if not fd.isdigit():
        return None
    sock = socket.socket(fileno=int(fd))
    sock.settimeout(PIPES_WAIT_SECONDS)  # they are sent before the request: never long
    return sock


def _pipes_for(request: dict[str, Any], sock: socket.socket | None) -> tuple[int, int] | None:
    """The resident runner's ends of its pipes (requests in, replies out), as the worker sent
    them with this request's id; None if none came. Ends sent with an earlier request (one
    this server never read a line of) are closed and passed over."""
    if sock is None:
        return None
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 64, 2)
        except OSError:
            return None
        if data.isdigit() and int(data) == request["id"] and len(fds) == 2:
            for fd in fds:  # as the worker's were: no command a runner runs gets them
                os.set_inheritable(fd, False)  # noqa: FBT003 - the stdlib's signature
            return fds[0], fds[1]
        for fd in fds:
            os.close(fd)
        if not (data.isdigit() and int(data) < request["id"]):
            return None


def _fork(
    request: dict[str, Any],
    inherited: list[int],
    pipes: socket.socket | None,
    reply: Callable[[dict[str, Any]], None],
    selector: selectors.BaseSelector,
    forked: set[int],
) -> None:
    control: tuple[int, int] | None = None  # a resident runner's: requests in, replies out
    if request.get("resident"):
        control = _pipes_for(request, pipes)
        if control is None:
            reply({"id": request["id"], "error": "its pipes did not come with the request"})
            return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in control or ():
            os.close(fd)
        reply({"id": request["id"], "error": str(exc)})
        return
    if pid == 0:
        selector.close()
        _child(request, inherited, control)
    for fd in control or ():  # the runner's and the worker's now: a later child never has them
        os.close(fd)
    forked.add(pid)
    reply({"id": request["id"], "pid": pid})


class _Sweeps:
    last = float("-inf")  # when the server last looked for strays


def _reap(reply: Callable[[dict[str, Any]], None], forked: set[int]) -> None:
    """Reap what ended: a runner's end goes to the worker; what its commands left that it did
    not end (killed by a signal, it could not) came to this subreaper, and ends here; those
    strays are reaped here too, and nobody is told."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in forked:
            continue  # a stray of a runner that is gone
        forked.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        # What its commands left that it could not end (killed by a signal; or orphaned to
        # it after its last look, then to us when it exited) ends here: at once after a
        # signal's kill, else at most every `STRAY_SWEEP_SECONDS` (the look reads all of
        # /proc, and a runner that exited ended its own nearly always).
        now = time.monotonic()
        if code < 0 or now - _Sweeps.last >= STRAY_SWEEP_SECONDS:
            _Sweeps.last = now
            strays.kill_children(keep=forked)
        reply({"pid": pid, "code": code})


def _with(body: dict[str, Any], sandbox: Sandbox | None) -> dict[str, Any]:
    return body if sandbox is None else {**body, "sandbox": sandbox.to_json()}


class ForkedProcess:
    """A runner forked by the server, looking enough like an asyncio Process for the worker."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def ended(self, code: int) -> None:
        self.returncode = code
        if not self._ended.done():
            self._ended.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)


class ResidentRun(ForkedProcess):
    """One activation on a resident runner: `pid` is the runner's (signalling it stops the
    runner), `wait()` gives the activation's exit code — or the runner's, if it ended first;
    `tail`, the end of what it logged when it failed there."""

    tail = ""


REPLIES_GRACE_SECONDS = 2.0
"""How long after a resident runner's exit its replies may still be read: they are all in
the pipe by then, up to its end — unless something it started holds the pipe open."""


class _Resident:
    """The worker's ends of a resident runner's pipes: its requests go in at one, its ends
    come out of the other. Plain non-blocking descriptors on the loop's reader and writer
    callbacks, closed here once — not pipe transports: uvloop's close a pipe's descriptor
    twice (libuv's close, then the file object's), and the second close can take a number a
    worker thread was given meanwhile (MagicStack/uvloop#763)."""

    def __init__(self, server: ForkServer, pid: int, requests: int, replies: int) -> None:
        self.pid = pid
        self.runs: dict[int, ResidentRun] = {}  # by request id: sent, not ended yet
        self.code: int | None = None  # its exit, once the server reported it
        self.grace: asyncio.TimerHandle | None = None
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._requests: int | None = requests
        self._replies: int | None = replies
        self._unsent = bytearray()  # of the last request: what the pipe has not taken yet
        self._lines = _Lines()
        for fd in (requests, replies):
            os.set_blocking(fd, False)
        self._loop.add_reader(replies, self._read)

    @property
    def writable(self) -> bool:
        return self._requests is not None

    @property
    def replies_ended(self) -> bool:
        return self._replies is None

    def send(self, line: bytes) -> None:
        """`line` to the runner, as much as the pipe takes now and the rest as it drains: a
        session's history makes a request megabytes long, and the loop must not wait."""
        if self._requests is None:
            raise OSError("the resident runner has ended")
        self._unsent += line
        self._write()
        if self._unsent and self._requests is not None:
            self._loop.add_writer(self._requests, self._write)

    def _write(self) -> None:
        if self._requests is None:
            return
        try:
            sent = os.write(self._requests, self._unsent)
        except BlockingIOError:
            return
        except OSError:  # the runner is gone: its exit ends what it was sent
            self.close_requests()
            return
        del self._unsent[:sent]
        if not self._unsent:
            self._loop.remove_writer(self._requests)

    def _read(self) -> bool:
        """Take what the runner wrote; whether more may come."""
        if self._replies is None:
            return False
        try:
            chunk = os.read(self._replies, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._close_replies()
            self._server._replies_ended(self)
            return False
        for line in self._lines.feed(chunk):
            with contextlib.suppress(ValueError):
                self._server._on_done(self, orjson.loads(line))
        return True

    def drain(self) -> None:
        """Everything it wrote that is in the pipe now (its exit came, its end may not)."""
        while self._read():
            pass

    def close_requests(self) -> None:
        if self._requests is not None:
            self._loop.remove_writer(self._requests)
            os.close(self._requests)
            self._requests = None
            self._unsent.clear()

    def _close_replies(self) -> None:
        if self._replies is not None:
            self._loop.remove_reader(self._replies)
            os.close(self._replies)
            self._replies = None

    def close(self) -> None:
        if self.grace is not None:
            self.grace.cancel()
        self.close_requests()
        self._close_replies()


class ForkServer:
    """The worker's side: starts the server and asks it for runners."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._next = 0
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exits reported before the spawn's reply was read
        # Starts given up on before the server named their process (by request id), and the
        # processes named too late, killed (their exits are nobody's).
        self._abandoned: set[int] = set()
        self._killed: set[int] = set()
        self._runs: dict[int, ResidentRun] = {}  # request id → an activation on a resident
        self._residents: dict[int, _Resident] = {}  # by pid: the worker's ends of its pipes
        self._pipes: socket.socket | None = None  # a resident runner's pipe ends go over it
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._ready = asyncio.Event()  # the server said it is warm

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def alive(self) -> bool:
        """Whether the server runs and its answers are read (it may have been killed: for
        memory, or by a process of the same user)."""
        return (
            self._proc is not None
            and self._proc.returncode is None
            and self._reader is not None
            and not self._reader.done()
        )

    async def start(self, ready_within: float = READY_SECONDS) -> None:
        """Start the server and wait until it is warm: a worker that pulled while its server
        still imported would hold its first dispatch for seconds, where another worker of the
        pool could start it at once. Returns early if the server died (`alive` then says so:
        the worker starts another), and after `ready_within` seconds in any case."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.settimeout(0)  # a server that stopped reading fails a start, never blocks the loop
        self._pipes = ours
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self._command(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env={**server_env(os.environ), PIPES_FD_ENV: str(theirs.fileno())},
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        self._reader = asyncio.create_task(self._read())
        ready = asyncio.create_task(self._ready.wait())
        await asyncio.wait({ready, self._reader}, timeout=ready_within,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        ready.cancel()
        if not self.ready:
            log("forkserver.not_ready", alive=self.alive, waited_seconds=ready_within)

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "suzumio.runner", "forkserver"]

    async def spawn(
        self,
        input_path: Path,
        cwd: Path,
        log: Path,
        env: dict[str, str],
        sandbox: Sandbox | None = None,
    ) -> ForkedProcess:
        """A runner for one activation, held to `sandbox`'s limits."""
        body = {"input": str(input_path), "cwd": str(cwd), "log": str(log)}
        return await self._fork(_with(body, sandbox), env)

    async def spawn_resident(
        self,
        cwd: Path,
        log: Path,
        env: dict[str, str],
        max_runs: int,
        sandbox: Sandbox | None = None,
    ) -> ForkedProcess:
        """A resident runner, waiting for activations (`run_in`); it leaves after `max_runs`.
        It is held to `sandbox`'s limits for all of them."""
        body = {"resident": True, "cwd": str(cwd), "log": str(log), "max_runs": max_runs}
        requests_r, requests_w = os.pipe()
        try:
            replies_r, replies_w = os.pipe()
        except OSError:
            os.close(requests_r)
            os.close(requests_w)
            raise
        try:
            child = await self._fork(_with(body, sandbox), env, (requests_r, replies_w))
        except BaseException:
            os.close(requests_w)
            os.close(replies_r)
            raise
        finally:  # the runner's ends: in the server (and the runner) once sent
            os.close(requests_r)
            os.close(replies_w)
        self._attach(child, requests_w, replies_r)
        return child

    def _attach(self, child: ForkedProcess, requests: int, replies: int) -> None:
        old = self._residents.get(child.pid)
        if old is not None:  # its pid came round again: that runner is long gone
            self._finish(old, old.code if old.code is not None else -int(signal.SIGKILL))
        self._residents[child.pid] = _Resident(self, child.pid, requests, replies)
        if child.returncode is not None:  # it ended before it was attached
            self._exited_resident(child.pid, child.returncode)

    async def run_in(
        self, runner: ForkedProcess, spec: str, cwd: Path, env: dict[str, str]
    ) -> ResidentRun:
        """One activation (`spec`: its input's JSON) on a resident runner, which must be idle
        and logs it where it logs everything: its request goes straight to the runner."""
        resident = self._residents.get(runner.pid)
        if runner.returncode is not None or resident is None or not resident.writable:
            raise OSError("the resident runner has ended")
        request_id = self._next_id()
        line = _encoded({"id": request_id, "spec": spec, "cwd": str(cwd), "env": env})
        resident.send(line)
        run = ResidentRun(runner.pid)
        self._runs[request_id] = resident.runs[request_id] = run
        return run

    def _next_id(self) -> int:
        self._next += 1
        return self._next

    async def _send(self, request: dict[str, Any], pipes: tuple[int, int] | None = None) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None or proc.stdin is None:
            raise OSError("the fork server is not running")
        line = _encoded(request)
        async with self._lock:
            if pipes is not None:  # first, and in the order of the requests they go with
                if self._pipes is None:
                    raise OSError("the fork server takes no pipes")
                socket.send_fds(self._pipes, [str(request["id"]).encode()], list(pipes))
            proc.stdin.write(line)
            await proc.stdin.drain()

    async def _fork(
        self, body: dict[str, Any], env: dict[str, str], pipes: tuple[int, int] | None = None
    ) -> ForkedProcess:
        request_id = self._next_id()
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = answer
        try:
            await self._send({"id": request_id, **body, "env": env}, pipes)
        except OSError:
            self._pending.pop(request_id, None)
            raise
        try:
            pid = await asyncio.wait_for(answer, FORK_ANSWER_SECONDS)
        except TimeoutError:
            # Reported as a failed start, and the attempt retried: the process, if the server
            # starts it after all, must not run beside the retry, nobody watching it.
            self._pending.pop(request_id, None)
            self._abandoned.add(request_id)
            raise
        child = ForkedProcess(pid)
        self._children[pid] = child
        if pid in self._early:
            child.ended(self._early.pop(pid))
        return child

    async def _read(self) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        try:
            while line := await self._proc.stdout.readline():
                try:
                    self._on_message(json.loads(line))
                except (ValueError, TypeError, KeyError) as exc:  # one line, not the rest
                    log("forkserver.bad_message", error=repr(exc)[:300])
        finally:
            # The server died (or its answers cannot be read): nobody answers any more, and
            # its runners died with it (parent-death signal) — every wait for one ends, else
            # a run would hold its dispatch, heartbeat on, forever.
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(OSError("the fork server stopped"))
            for child in self._children.values():
                child.ended(-int(signal.SIGKILL))
            for run in self._runs.values():
                run.ended(-int(signal.SIGKILL))
            for resident in self._residents.values():
                resident.close()

    def _on_message(self, message: dict[str, Any]) -> None:
        if isinstance(message, dict) and message.get("ready") is True:
            self._ready.set()
            return
        if "code" in message:
            self._exited(int(message["pid"]), int(message["code"]))
            return
        if message["id"] in self._abandoned:
            self._abandoned.discard(message["id"])
            if "pid" in message:
                pid = int(message["pid"])
                self._killed.add(pid)
                log("forkserver.late_start_killed", pid=pid)
                # Its group, and itself: answered as soon as it was forked, it may not have
                # made its own group yet.
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        kill(pid, signal.SIGKILL)
            return
        answer = self._pending.pop(message["id"], None)
        if answer is not None and not answer.done():
            if "error" in message:
                answer.set_exception(OSError(message["error"]))
            else:
                answer.set_result(int(message["pid"]))

    def _exited(self, pid: int, code: int) -> None:
        if pid in self._killed:  # a start given up on: kept, its exit would end a later
            self._killed.discard(pid)  # process given the same pid at once
            return
        child = self._children.pop(pid, None)
        if child is None:
            self._early[pid] = code
        else:
            child.ended(code)
        self._exited_resident(pid, code)

    def _exited_resident(self, pid: int, code: int) -> None:
        """A resident runner's activation that it ended before ends with the runner's code —
        once what it wrote has been read: an end it reported comes before its exit."""
        resident = self._residents.get(pid)
        if resident is None:
            return
        resident.code = code
        resident.close_requests()
        if resident.replies_ended:
            self._finish(resident, code)
        elif resident.grace is None:
            loop = asyncio.get_running_loop()
            resident.grace = loop.call_later(REPLIES_GRACE_SECONDS, self._give_up, resident)

    def _give_up(self, resident: _Resident) -> None:
        """Its pipe has not ended (something it started holds it open): what is in it now is
        all it wrote."""
        resident.drain()
        if resident.code is not None:
            self._finish(resident, resident.code)

    def _replies_ended(self, resident: _Resident) -> None:
        if resident.code is not None:  # else its exit comes from the server
            self._finish(resident, resident.code)

    def _finish(self, resident: _Resident, code: int) -> None:
        if self._residents.get(resident.pid) is resident:
            del self._residents[resident.pid]
        resident.close()
        for request_id, run in resident.runs.items():  # it ended before they did
            self._runs.pop(request_id, None)
            run.ended(code)
        resident.runs.clear()

    def _on_done(self, resident: _Resident, answer: Any) -> None:
        """A resident runner's end of an activation — one of its own: a runner that wrote
        anything else (or named another's) ends nothing."""
        if not _is_done(answer):
            return
        run = resident.runs.pop(answer["id"], None)
        if run is None:
            return
        self._runs.pop(answer["id"], None)
        run.tail = str(answer.get("tail", ""))
        run.ended(int(answer["done"]))

    async def close(self) -> None:
        for resident in self._residents.values():
            resident.close()
        if self._pipes is not None:
            self._pipes.close()
        if self._proc is not None and self._proc.returncode is None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 5)
            if self._proc.returncode is None:
                self._proc.kill()
        if self._reader is not None:
            self._reader.cancel()
