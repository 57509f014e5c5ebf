"""`python -m suzumio.runner run|check [input.json]`.

`run` executes one activation (the agent loop) and exits with a code that says why it ended
(`suzumio.runner.exits`); `check` only validates an input file. Both refuse an input they do
not understand, with a message and exit code 2, instead of guessing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from suzumio.contracts.runner import RunnerActivationInput

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suzumio.runner")
    commands = parser.add_subparsers(dest="command", required=True)
    check_cmd = commands.add_parser("check", help="validate an activation input file")
    check_cmd.add_argument("input", type=Path, nargs="?", default=Path("/activation/input.json"))
    run_cmd = commands.add_parser("run", help="run one activation")
    run_cmd.add_argument("input", type=Path, nargs="?", default=Path("/activation/input.json"))
    args = parser.parse_args(argv)
    if args.command == "run":
        from suzumio.runner.main import run  # noqa: PLC0415 - `check` stays light

        return run(args.input)
    return check(args.input)


if __name__ == "__main__":
    sys.exit(main())
