"""A sandbox runner's own file exchange, through the tool-broker and with its activation token,
for sandboxes that share neither a disk nor the platform's NATS with the orchestrator
(kubernetes Jobs: the input names them in `files`). The session's artifacts are fetched into
`/workspace/in` before the loop; what the activation left in `/workspace/out` is sent back
after it, and the broker records each file as an artifact of the session.

Where the orchestrator's host or a pool worker exchanges the files, `files` is not set and the
runner does none of this.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from suzumio.contracts.runner import FileExchange, placeable
from suzumio.runner.broker import BrokerClient, BrokerError, BrokerUnavailableError, FencedError
from suzumio.runner.log import log
from suzumio.runner.workfiles import ExchangeError, open_output, place, regular_files

MAX_PATH = 1_000  # characters of an artifact's path, as the orchestrator and the broker take


async def fetch_inputs(broker: BrokerClient, workspace: Path, files: FileExchange) -> None:
    """Each input at its path under `workspace/in` (one there with exactly its bytes is kept).

    Raises:
        ExchangeError: an input could not be fetched or written.
        FencedError, BrokerUnavailableError: as any broker call.
    """
    for ref in files.inputs:
        try:
            await place(workspace / "in", ref, partial(broker.download, ref))
        except (FencedError, BrokerUnavailableError, ExchangeError):
            raise
        except (BrokerError, ValueError, OSError) as exc:
            raise ExchangeError(f"input {ref.path}: {exc}"[:300]) from None


async def send_outputs(broker: BrokerClient, workspace: Path, files: FileExchange) -> int:
    """Send the regular files under `workspace/out` (never following a link), within the
    limits; a file the broker refuses stays behind and the others still go. The number sent.

    Raises:
        FencedError, BrokerUnavailableError: the activation may no longer act, or the broker
            cannot be reached: nothing more can be sent.
    """
    outbox = workspace / "out"
    sent = 0
    for path in regular_files(outbox):
        relative = path.relative_to(outbox).as_posix()
        if sent >= files.max_output_files:
            log("handover.too_many_outputs", limit=files.max_output_files)
            break
        try:
            opened = open_output(path)
        except OSError as exc:
            log("handover.output_skipped", path=_shown(relative), error=repr(exc)[:300])
            continue
        if opened is None:
            continue
        source, size = opened
        with source:
            if size > files.max_output_bytes or not _sendable(relative):
                log("handover.output_skipped", path=_shown(relative), size=size)
                continue
            try:
                await broker.upload(sent, relative, source, size)
            except FencedError:
                raise
            except BrokerError as exc:  # refused (too large for the broker's own limit, …)
                log("handover.output_refused", path=_shown(relative), status=exc.status)
                continue
            except OSError as exc:  # unreadable, or shrunk since its size was taken
                log("handover.output_skipped", path=_shown(relative), error=repr(exc)[:300])
                continue
        sent += 1
    return sent


def _sendable(path: str) -> bool:
    """Whether a file of `out` at `path` can be an artifact, as the orchestrator collects one
    (docs/orchestrator.md): a name a workspace could hold again, of at most `MAX_PATH`
    characters, in UTF-8. A name of other bytes (a lone surrogate here) cannot even be put in
    the upload's query: httpx would raise while building the request, and the activation
    would end without its final call."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return len(path) <= MAX_PATH and placeable(path)


def _shown(path: str) -> str:
    """`path` for the log, its bytes that are not UTF-8 as `\\xNN` escapes (as `ls -b`)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
