"""The runner's `assets/` directory is the package's: before the assets are fetched again,
whatever is not one of them (an asset the package dropped, a file the agent added, a link it
planted) goes, without following a link; the assets that are there stay to be checked."""

from __future__ import annotations

from pathlib import Path

from suzumio.contracts.runner import FileRef
from suzumio.runner.assets import prune


def ref(path: str) -> FileRef:
    return FileRef(path=path, sha256="a" * 64, size=1)


def tree(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) + ("/" if p.is_dir() and not p.is_symlink() else "")
        for p in root.rglob("*")
    )


def test_what_is_not_an_asset_goes_and_links_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("host file")
    root = tmp_path / "assets"
    (root / "docs" / "old").mkdir(parents=True)
    (root / "docs" / "style.md").write_text("asset")
    (root / "docs" / "dropped.md").write_text("no longer in the package")
    (root / "docs" / "old" / "x.txt").write_text("x")
    (root / "mine.txt").write_text("the agent's")
    (root / "link").symlink_to(outside)
    (root / "docs" / "linked.md").symlink_to(outside / "keep.txt")
    (root / "docs").chmod(0o500)  # made read-only by the agent
    prune(root, (ref("docs/style.md"), ref("docs/linked.md")))
    assert tree(root) == ["docs/", "docs/style.md"]
    assert (outside / "keep.txt").read_text() == "host file"


def test_no_assets_removes_the_directory_and_a_link_in_its_place(tmp_path: Path) -> None:
    root = tmp_path / "assets"
    (root / "a").mkdir(parents=True)
    (root / "a" / "b.txt").write_text("b")
    (root / "a").chmod(0o000)
    prune(root, ())
    assert not root.exists()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("f")
    root.symlink_to(outside)
    prune(root, (ref("f"),))
    assert not root.is_symlink()
    assert not root.exists()
    assert (outside / "f").read_text() == "f"


def test_a_file_where_a_directory_of_assets_goes_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "assets"
    root.mkdir()
    (root / "docs").write_text("a file, not a directory")
    prune(root, (ref("docs/style.md"),))
    assert tree(root) == []
