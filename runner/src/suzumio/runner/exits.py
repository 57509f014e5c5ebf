"""Exit codes: why the runner ended, for the orchestrator (and a person reading `ps`)."""

from __future__ import annotations

COMPLETED = 0
CRASHED = 1  # an unexpected error in the runner itself
BAD_INPUT = 2  # the input file is missing or not a contract this runner knows
WAITING = 3  # asked a person; checkpointed; a later signal resumes the work
BUDGET_EXHAUSTED = 4  # the model-call budget ran out; the grace summary is the output
MODEL_FAILED = 5  # every model of the chain failed (or content policy); output says why
FENCED = 6  # the broker refused the token: cancelled, replaced by a P0, or expired
BROKER_UNREACHABLE = 7
TIMED_OUT = 8  # the activation's wall-clock limit
TERMINATED = 9  # SIGTERM / SIGINT before the output was recorded
INPUTS_UNAVAILABLE = 10  # the session's files could not be fetched into /workspace/in
MODEL_REFUSED = 11  # the model refused for good (content policy, credentials, no such model)

BY_REASON = {"completed": COMPLETED, "waiting": WAITING, "budget_exhausted": BUDGET_EXHAUSTED}
