"""A session's files as the orchestrator's directory folds them from the log: the newest of
each path, deletions undone in place, a closed session's let go, a reopened one's left to the
projection."""

from __future__ import annotations

from suzumio.contracts.events import (
    ArtifactDeleted,
    ArtifactRecorded,
    SessionClosed,
    SessionReopened,
)
from suzumio.orchestrator.directory import Directory
from suzumio.orchestrator.sessions import Artifact

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def recorded(path: str, sha256: str, session_id: str | None = "s1") -> ArtifactRecorded:
    return ArtifactRecorded(
        project_id="p1", session_id=session_id, path=path, sha256=sha256, size=len(path)
    )


def test_the_newest_of_each_path_in_path_order_and_a_deletion_shows_the_one_before() -> None:
    d = Directory()
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
    assert list(files) == ["b/notes.md", "z.txt"]

    d.apply("a3", ArtifactDeleted())
    assert d.session_files("s1") == {
        "b/notes.md": Artifact("a2", "b/notes.md", SHA_B, 10),
        "z.txt": Artifact("a1", "z.txt", SHA_A, 5),
    }
    assert d.session_files("s2") == {"elsewhere.txt": Artifact("a4", "elsewhere.txt", SHA_A, 13)}
    assert d.session_files("never-seen") == {}


def test_a_closed_sessions_files_are_let_go_and_a_reopened_one_asks_the_projection() -> None:
    d = Directory()
    d.apply("a1", recorded("z.txt", SHA_A))
    d.apply("s1", SessionClosed())
    assert d.session_files("s1") == {}
    d.apply("a1", ArtifactDeleted())  # of a session let go: nothing to undo
    d.apply("s1", SessionReopened())
    assert d.session_files("s1") is None  # the fold no longer knows them all
    d.apply("a2", recorded("new.txt", SHA_B))
    assert d.session_files("s1") is None
