"""Pods of a Job that will never start (DESIGN.md §8: status from watching Job *and* Pod).

A Job with `backoffLimit: 0` fails only when its pod fails, and a pod that cannot start does
not fail: its container waits (`ImagePullBackOff`, `CreateContainerConfigError`, …) or the
scheduler finds no node for it, until the Job's `activeDeadlineSeconds` ends it, as a timeout,
an hour later. `StartCheck` reads the pods the watch sees and says when to give up:

- at once for what never heals: `InvalidImageName`, `CreateContainerConfigError` (a missing
  key, `runAsNonRoot` and an image that runs as root, …), `ErrImageNeverPull` — not
  retryable, the same plan fails the same way;
- after `start_grace_seconds` (a slow registry, a rate limit, a runtime hiccup all pass) for
  `ErrImagePull`, `ImagePullBackOff` and `CreateContainerError` — retryable: a new attempt is
  a new pod, maybe on another node, against a registry that may be back;
- after `unschedulable_grace_seconds` for a pod the scheduler cannot place (`PodScheduled`
  False, `Unschedulable`) — retryable: capacity comes and goes;
- after `unschedulable_grace_seconds` too for a running Job without any pod: the Job
  controller could not create one (a ResourceQuota, Pod Security admission, a webhook). The
  Job gets no condition for that, only `FailedCreate` events, and it would wait for its
  deadline — retryable: a quota frees up (the caller may say more from those events).

A grace counts from when this check first saw the condition (a watch of an orchestrator that
restarted counts again; the Job's deadline still bounds it all), and starts over once the
condition is gone (a pull that failed once, then worked).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from suzumio.orchestrator.backends.base import Exit

Manifest = dict[str, Any]

NEVER_STARTS = frozenset({"InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"})
MAY_PASS = frozenset({"ErrImagePull", "ImagePullBackOff", "CreateContainerError"})
UNSCHEDULABLE = "Unschedulable"
NO_POD = "NoPod"
_MAX_MESSAGE = 1_000  # kubelet messages can quote a whole registry answer


@dataclass(frozen=True)
class Stuck:
    """A pod that will not start: why (the kubelet's or the scheduler's reason and message),
    and whether a new attempt could do better."""

    reason: str
    message: str
    retryable: bool

    @property
    def detail(self) -> str:
        return f"the pod did not start: {self.reason}: {self.message[:_MAX_MESSAGE]}".rstrip(": ")

    def exit(self) -> Exit:
        return Exit(None, "lost", self.detail, retryable=self.retryable)  # nothing ran


def _uid(pod: Manifest) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name") or "")


def _problems(pod: Manifest) -> list[tuple[str, str]]:
    """(reason, message) of every waiting container and of an unschedulable pod."""
    status = pod.get("status") or {}
    found: list[tuple[str, str]] = []
    for key in ("initContainerStatuses", "containerStatuses"):
        waiting = [((c.get("state") or {}).get("waiting") or {}) for c in status.get(key) or []]
        found.extend(
            (w["reason"], w.get("message") or "")
            for w in waiting
            if w.get("reason") in NEVER_STARTS | MAY_PASS
        )
    found.extend(
        (UNSCHEDULABLE, c.get("message") or "")
        for c in status.get("conditions") or []
        if (c.get("type"), c.get("status"), c.get("reason"))
        == ("PodScheduled", "False", UNSCHEDULABLE)
    )
    return found


class StartCheck:
    """Follows the pods of one Job across watch events and polls (see the module)."""

    def __init__(
        self,
        start_grace_seconds: float,
        unschedulable_grace_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._graces = {"start": start_grace_seconds, "schedule": unschedulable_grace_seconds}
        self._clock = clock
        self._seen: dict[tuple[str, str], float] = {}  # (pod uid, grace) -> first seen
        self._no_pod_since: float | None = None  # when a list first showed the Job none

    def check(self, pod: Manifest) -> Stuck | None:
        """The pod as it is now: a `Stuck` once it is given up, else None."""
        uid = _uid(pod)
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            self.forget(pod)
            return None
        now = self._clock()
        current: set[tuple[str, str]] = set()
        for reason, message in _problems(pod):
            if reason in NEVER_STARTS:
                return Stuck(reason, message, retryable=False)
            key = (uid, "schedule" if reason == UNSCHEDULABLE else "start")
            current.add(key)
            since = self._seen.setdefault(key, now)
            if now - since >= self._graces[key[1]]:
                return Stuck(reason, message, retryable=True)
        for key in [k for k in self._seen if k[0] == uid and k not in current]:
            del self._seen[key]  # it passed: a later one gets its whole grace again
        return None

    def check_all(self, pods: Iterable[Manifest]) -> Stuck | None:
        """All the Job's pods as a list shows them: one missing is gone, and so is its count;
        none at all is counted too (only a list tells that: a watch's events may lag)."""
        listed = list(pods)
        present = {_uid(pod) for pod in listed}
        for key in [k for k in self._seen if k[0] not in present]:
            del self._seen[key]
        if listed:
            self._no_pod_since = None
        else:
            now = self._clock()
            if self._no_pod_since is None:
                self._no_pod_since = now
            if now - self._no_pod_since >= self._graces["schedule"]:
                message = (
                    f"no pod was created for the Job in {self._graces['schedule']:.0f} s (see "
                    "its FailedCreate events: a quota, an admission policy or a webhook)"
                )
                return Stuck(NO_POD, message, retryable=True)
            return None
        for pod in listed:
            if (stuck := self.check(pod)) is not None:
                return stuck
        return None

    def forget(self, pod: Manifest) -> None:
        uid = _uid(pod)
        for key in [k for k in self._seen if k[0] == uid]:
            del self._seen[key]

    def next_deadline_in(self) -> float | None:
        """Seconds until the nearest grace being counted ends (None: none is counted)."""
        if not self._seen:
            return None
        now = self._clock()
        return max(0.0, min(t + self._graces[g] - now for (_, g), t in self._seen.items()))

    def no_pod_deadline_in(self) -> float | None:
        """Seconds until the Job without any pod is given up (None: it has one, or no list
        has been looked at yet)."""
        if self._no_pod_since is None:
            return None
        return max(0.0, self._no_pod_since + self._graces["schedule"] - self._clock())
