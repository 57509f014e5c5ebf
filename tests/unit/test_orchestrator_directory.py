"""A session's files as the orchestrator's directory folds them from the log: the newest of
each path of an open session; where the fold cannot answer as the projection would (a closed
or reopened session, a deletion that shows an older file again), it leaves it to the
projection."""

from __future__ import annotations

from suzumio.contracts.events import (
    ArtifactDeleted,
    ArtifactRecorded,
    SessionClosed,
    SessionOpened,
    SessionReopened,
)
from suzumio.orchestrator.directory import Directory
from suzumio.orchestrator.sessions import Artifact

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def recorded(path: str, sha256: str, session_id: str | None = "s1") -> ArtifactRecorded:
    return ArtifactRecorded(
        project_id="p1", session_id=session_id, path=path, sha256=sha256, size=len(path)
    )


def opened(*session_ids: str) -> Directory:
    d = Directory()
    for session_id in session_ids:
        d.apply(session_id, SessionOpened(project_id="p1", agent_id="g1"))
    return d


def test_the_newest_of_each_path_in_path_order() -> None:
    d = opened("s1", "s2")
    d.apply("a1", recorded("z.txt", SHA_A))
    d.apply("a2", recorded("b/notes.md", SHA_B))
    d.apply("a3", recorded("z.txt", SHA_C))  # the same path again: this one wins
    d.apply("a4", recorded("elsewhere.txt", SHA_A, session_id="s2"))
    d.apply("a5", recorded("project-wide.txt", SHA_A, session_id=None))
    files = d.session_files("s1")
    assert files == {
        "b/notes.md": Artifact("a2", "b/notes.md", SHA_B, 10),
        "z.txt": Artifact("a3", "z.txt", SHA_C, 5),
    }
    assert list(files or ()) == ["b/notes.md", "z.txt"]
    assert d.session_files("s2") == {"elsewhere.txt": Artifact("a4", "elsewhere.txt", SHA_A, 13)}
    assert d.session_files("never-opened") is None  # the projection knows


def test_deleting_the_only_file_of_a_path_removes_it_and_an_older_ones_is_left_alone() -> None:
    d = opened("s1")
    d.apply("a1", recorded("z.txt", SHA_A))
    d.apply("a2", recorded("z.txt", SHA_B))
    d.apply("a3", recorded("only.txt", SHA_C))
    d.apply("a1", ArtifactDeleted())  # an older one: nothing shows differently
    d.apply("a3", ArtifactDeleted())  # the only one of its path: gone
    assert d.session_files("s1") == {"z.txt": Artifact("a2", "z.txt", SHA_B, 5)}


def test_deleting_the_newest_of_a_path_with_an_older_one_leaves_the_session_to_the_projection(
) -> None:  # fmt: skip
    d = opened("s1", "s2")
    d.apply("a1", recorded("z.txt", SHA_A))
    d.apply("a2", recorded("z.txt", SHA_B))
    d.apply("a3", recorded("other.txt", SHA_A, session_id="s2"))
    d.apply("a2", ArtifactDeleted())  # a1 shows again, and the fold let it go
    assert d.session_files("s1") is None
    d.apply("a4", recorded("new.txt", SHA_C))
    assert d.session_files("s1") is None
    assert d.session_files("s2") == {"other.txt": Artifact("a3", "other.txt", SHA_A, 9)}


def test_a_closed_sessions_files_are_let_go_also_when_it_is_reopened() -> None:
    d = opened("s1")
    d.apply("a1", recorded("z.txt", SHA_A))
    d.apply("s1", SessionClosed())
    assert d.session_files("s1") is None
    d.apply("a2", recorded("late.txt", SHA_B))  # an activation still running: not held
    d.apply("s1", SessionReopened())
    assert d.session_files("s1") is None
