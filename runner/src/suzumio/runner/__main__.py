"""`python -m suzumio.runner run|check [input.json]`, `python -m suzumio.runner worker`.

`run` executes one activation (the agent loop) and exits with a code that says why it ended
(`suzumio.runner.exits`); `check` only validates an input file. Both refuse an input they do
not understand, with a message and exit code 2, instead of guessing. `worker` serves a pool:
it pulls dispatches from the queue and runs each as a separate `run` (`suzumio.runner.worker`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from suzumio.contracts.runner import RunnerActivationInput
from suzumio.runner.cpu import CpuPolicy

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def check(path: Path) -> int:
    try:
        spec = RunnerActivationInput.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        print(f"runner: no input file at {path}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValidationError as exc:
        print(f"runner: {path} is not a valid activation input:\n{exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(
        f"activation {spec.activation.id}: agent {spec.agent.id} on session {spec.session.id}, "
        f"{len(spec.activation.signals)} signal(s), {len(spec.history)} history entries"
    )
    return EXIT_OK


def add_worker_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = commands.add_parser("worker", help="serve a worker pool: pull dispatches, run them")
    cmd.add_argument("--pool", default="default")
    cmd.add_argument("--nats", default=os.environ.get("SUZUMIO_NATS_URL", "nats://127.0.0.1:4222"))
    cmd.add_argument("--namespace", default=os.environ.get("SUZUMIO_NAMESPACE", ""))
    cmd.add_argument("--concurrency", type=int, default=1, help="runs at once")
    cmd.add_argument("--workdir", type=Path, default=None, help="work directories go here")
    cmd.add_argument("--worker-id", default=None, help="default: host name and a random suffix")
    cmd.add_argument("--heartbeat", type=float, default=3.0, help="seconds between heartbeats")
    cmd.add_argument("--idle-ttl", type=float, default=0.0, help="keep warm sessions (seconds)")
    cmd.add_argument(
        "--take-routed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="take a warm session's next dispatches sent to this worker (session affinity; "
        "with --idle-ttl)",
    )
    cmd.add_argument("--max-warm", type=int, default=8, help="warm sessions kept at most")
    cmd.add_argument("--kill-grace", type=float, default=5.0, help="SIGTERM to SIGKILL (s)")
    cmd.add_argument("--drain", type=float, default=30.0, help="wait for runs at shutdown (s)")
    cmd.add_argument(
        "--cold", action="store_true", help="start a new Python per activation (no fork server)"
    )
    cmd.add_argument(
        "--resident-runs",
        type=int,
        default=100,
        help="a warm session's runner stays for up to this many of its activations (0: one "
        "runner per activation)",
    )
    cmd.add_argument(
        "--no-cgroups",
        action="store_true",
        help="hold runners to their profile's limits by rlimits only, even where this host "
        "would let the worker make a cgroup per run",
    )
    cmd.add_argument(
        "--cpu-policy",
        default=None,
        help="batch: Linux's SCHED_BATCH for the worker and its runners, whose wake-ups then "
        "do not preempt the process running; inherit: the policy it was started with "
        "(default: SUZUMIO_CPU_POLICY, else batch)",
    )
    cmd.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="serve GET /healthz (alive) and /readyz (taking work) over HTTP on this port "
        "(0: any free one, logged); default: no health endpoint",
    )
    cmd.add_argument(
        "--health-host",
        default="127.0.0.1",
        help="the address --health-port listens on (0.0.0.0 for a kubelet's probes)",
    )


def _cpu_policy(flag: str | None) -> CpuPolicy:
    """The flag's, else the variable's (in any case, as the services take it), else batch."""
    if flag is not None:
        given, where = flag, "--cpu-policy"
    else:
        given, where = os.environ.get("SUZUMIO_CPU_POLICY", "batch"), "SUZUMIO_CPU_POLICY"
    match given.strip().lower():
        case "batch":
            return "batch"
        case "inherit":
            return "inherit"
    raise ValueError(f"{where} must be batch or inherit, not {given!r}")


def worker(args: argparse.Namespace) -> int:
    from suzumio.runner.worker import WorkerConfig, serve  # noqa: PLC0415 - only `worker` needs NATS

    try:
        config = WorkerConfig(
            nats_url=args.nats,
            namespace=args.namespace,
            pool=args.pool,
            concurrency=max(args.concurrency, 1),
            heartbeat_seconds=args.heartbeat,
            idle_ttl_seconds=args.idle_ttl,
            max_warm=args.max_warm,
            kill_grace_seconds=args.kill_grace,
            drain_seconds=args.drain,
            warm_runners=not args.cold,
            resident_runs=max(args.resident_runs, 0),
            take_routed=args.take_routed,
            cpu_policy=_cpu_policy(args.cpu_policy),
            cgroups=not args.no_cgroups,
            health_port=args.health_port,
            health_host=args.health_host,
        )
        if args.workdir is not None:
            config = replace(config, workdir=args.workdir)
        if args.worker_id:
            config = replace(config, worker_id=args.worker_id)
    except ValueError as exc:
        print(f"runner worker: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return serve(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suzumio.runner")
    commands = parser.add_subparsers(dest="command", required=True)
    check_cmd = commands.add_parser("check", help="validate an activation input file")
    check_cmd.add_argument("input", type=Path, nargs="?", default=Path("/activation/input.json"))
    run_cmd = commands.add_parser("run", help="run one activation")
    run_cmd.add_argument("input", type=Path, nargs="?", default=Path("/activation/input.json"))
    add_worker_command(commands)
    commands.add_parser("forkserver", help="(internal) the worker's source of warm runners")
    args = parser.parse_args(argv)
    if args.command == "worker":
        return worker(args)
    if args.command == "forkserver":
        from suzumio.runner.forkserver import serve  # noqa: PLC0415

        return serve()
    if args.command == "run":
        from suzumio.runner.main import run  # noqa: PLC0415 - `check` stays light

        return run(args.input)
    return check(args.input)


if __name__ == "__main__":
    sys.exit(main())
