"""The file tools stay inside the workspace and granted mounts (DESIGN.md §10), and do what they
say: numbered reads with caps, atomic writes, all-or-nothing patches, bounded searches."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from suzumio.runner.tools.base import Mount, ToolContext, ToolLimits, ToolResult
from suzumio.runner.tools.files import FilePatch, FileRead, FileSearch, FileWrite
from suzumio.runner.tools.paths import atomic_write, resolve
from suzumio.runner.tools.registry import BUILTIN_TOOLS, builtin_tools

SECRET = "top secret outside the workspace\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("one\ntwo\nthree\n")
    return workspace


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    other = tmp_path / "outside"
    other.mkdir()
    (other / "secret.txt").write_text(SECRET)
    return other


def ctx_for(workspace: Path, *mounts: Mount, **limits: Any) -> ToolContext:
    return ToolContext(workspace=workspace, mounts=mounts, limits=ToolLimits(**limits))


async def read(ctx: ToolContext, **args: Any) -> ToolResult:
    return await FileRead().run(args, ctx)


async def write(ctx: ToolContext, path: str, content: str) -> ToolResult:
    return await FileWrite().run({"path": path, "content": content}, ctx)


async def patch(ctx: ToolContext, path: str, *edits: dict[str, Any]) -> ToolResult:
    return await FilePatch().run({"path": path, "edits": list(edits)}, ctx)


# --- reading -------------------------------------------------------------------------------


async def test_read_numbers_lines_and_pages_with_offset_and_limit(ws: Path) -> None:
    ctx = ctx_for(ws)
    whole = await read(ctx, path="hello.txt")
    assert whole.status == "ok"
    assert whole.text == "     1\tone\n     2\ttwo\n     3\tthree\n"
    page = await read(ctx, path="hello.txt", offset=2, limit=1)
    assert page.text.startswith("     2\ttwo\n")
    assert "[truncated: 6 more bytes] continue with offset=3" in page.text
    past = await read(ctx, path="hello.txt", offset=9)
    assert "past the end" in past.text


async def test_read_is_capped_with_a_note(ws: Path) -> None:
    (ws / "big.txt").write_text("".join(f"line {i}\n" for i in range(10_000)))
    result = await read(ctx_for(ws, read_max_bytes=1000), path="big.txt")
    body, note = result.text.split("[truncated: ")
    assert len(body.encode()) <= 1000
    remaining = int(note.split()[0])
    assert remaining == (ws / "big.txt").stat().st_size - sum(
        len(row.split("\t", 1)[1]) + 1 for row in body.splitlines()
    )


async def test_a_single_huge_line_is_cut_not_loaded(ws: Path) -> None:
    (ws / "min.js").write_text("x" * 3_000_000)
    result = await read(ctx_for(ws, read_max_bytes=500), path="min.js")
    assert "[line 1 cut]" in result.text
    assert len(result.text) < 700


async def test_binary_files_and_directories(ws: Path) -> None:
    (ws / "blob.bin").write_bytes(b"\x89PNG\x00\x01" * 100)
    (ws / "sub").mkdir()
    ctx = ctx_for(ws)
    binary = await read(ctx, path="blob.bin")
    assert binary.text == "blob.bin is a binary file (600 bytes)"
    listing = await read(ctx, path=".")
    assert listing.text.splitlines() == ["./ (3 entries)", "blob.bin", "hello.txt", "sub/"]


async def test_read_of_a_fifo_does_not_hang(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    result = await read(ctx_for(ws), path="pipe")
    assert result.status == "error"
    assert "not a regular file" in result.text


# --- confinement ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["../outside/secret.txt", "sub/../../outside/secret.txt", "./../outside/secret.txt"]
)
async def test_dotdot_escapes_are_refused(ws: Path, outside: Path, path: str) -> None:
    ctx = ctx_for(ws)
    for result in (await read(ctx, path=path), await write(ctx, path, "pwned")):
        assert result.status == "error"
        assert "outside the workspace" in result.text
    assert (outside / "secret.txt").read_text() == SECRET


async def test_dotdot_that_stays_inside_is_fine(ws: Path) -> None:
    (ws / "sub").mkdir()
    result = await read(ctx_for(ws), path="sub/../hello.txt")
    assert result.status == "ok"


async def test_absolute_paths_outside_are_refused_inside_accepted(ws: Path, outside: Path) -> None:
    ctx = ctx_for(ws)
    refused = await read(ctx, path=str(outside / "secret.txt"))
    assert refused.status == "error"
    assert SECRET.strip() not in refused.text
    assert (await read(ctx, path="/etc/passwd")).status == "error"
    assert (await write(ctx, str(outside / "new.txt"), "x")).status == "error"
    assert not (outside / "new.txt").exists()
    inside = await read(ctx, path=str(ws / "hello.txt"))
    assert inside.status == "ok"


async def test_nul_bytes_and_empty_paths_are_refused(ws: Path) -> None:
    ctx = ctx_for(ws)
    assert "NUL" in (await read(ctx, path="hello.txt\x00.png")).text
    assert (await read(ctx, path="")).status == "error"
    assert (await FileRead().run({}, ctx)).status == "error"


async def test_symlinked_file_leaving_the_workspace(ws: Path, outside: Path) -> None:
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    ctx = ctx_for(ws)
    refused = await read(ctx, path="link.txt")
    assert refused.status == "error"
    assert "symbolic link" in refused.text
    assert (await write(ctx, "link.txt", "pwned")).status == "error"
    assert (await patch(ctx, "link.txt", {"old": "top", "new": "pwned"})).status == "error"
    assert (outside / "secret.txt").read_text() == SECRET


async def test_symlinked_directory_in_the_middle_of_a_path(ws: Path, outside: Path) -> None:
    (ws / "docs").symlink_to(outside, target_is_directory=True)
    ctx = ctx_for(ws)
    assert (await read(ctx, path="docs/secret.txt")).status == "error"
    assert (await write(ctx, "docs/new.txt", "pwned")).status == "error"
    assert (await write(ctx, "docs/deeper/new.txt", "pwned")).status == "error"
    search = await FileSearch().run({"pattern": "secret", "path": "docs"}, ctx)
    assert search.status == "error"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


async def test_dangling_link_to_outside_is_refused_for_write(ws: Path, outside: Path) -> None:
    (ws / "planted").symlink_to(outside / "created-by-write.txt")
    result = await write(ctx_for(ws), "planted", "pwned")
    assert result.status == "error"
    assert not (outside / "created-by-write.txt").exists()


async def test_links_inside_the_workspace_resolve_to_their_target(ws: Path) -> None:
    (ws / "alias.txt").symlink_to(ws / "hello.txt")
    ctx = ctx_for(ws)
    assert FileWrite().paths({"path": "alias.txt", "content": ""}, ctx) == (ws / "hello.txt",)
    assert (await write(ctx, "alias.txt", "new\n")).status == "ok"
    assert (ws / "hello.txt").read_text() == "new\n"
    assert (ws / "alias.txt").is_symlink()


async def test_a_link_planted_after_resolution_is_replaced_not_followed(
    ws: Path, outside: Path
) -> None:
    ctx = ctx_for(ws)
    target = resolve("hello.txt", ctx, write=True)
    (ws / "hello.txt").unlink()
    (ws / "hello.txt").symlink_to(outside / "secret.txt")  # the race: swapped in after the check
    with pytest.raises(ValueError, match="not a regular file"):
        atomic_write(target, b"pwned")
    assert (outside / "secret.txt").read_text() == SECRET


async def test_read_only_mount_reads_but_refuses_writes(ws: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "ref.txt").write_text("reference\n")
    ctx = ctx_for(ws, Mount(data, writable=False))
    assert "reference" in (await read(ctx, path=str(data / "ref.txt"))).text
    refused = await write(ctx, str(data / "ref.txt"), "changed")
    assert refused.status == "error"
    assert "read-only mount" in refused.text
    assert (await patch(ctx, str(data / "ref.txt"), {"old": "ref", "new": "x"})).status == "error"
    assert (await write(ctx, str(data / "new.txt"), "x")).status == "error"
    assert (data / "ref.txt").read_text() == "reference\n"
    assert not (data / "new.txt").exists()


async def test_read_only_mount_inside_the_workspace_stays_read_only(ws: Path) -> None:
    (ws / "vendor").mkdir()
    ctx = ctx_for(ws, Mount(ws / "vendor", writable=False))
    assert (await write(ctx, "vendor/x.txt", "x")).status == "error"
    assert (await write(ctx, "elsewhere.txt", "x")).status == "ok"


async def test_writable_mount_accepts_writes(ws: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ctx = ctx_for(ws, Mount(out, writable=True))
    result = await write(ctx, str(out / "report" / "r.md"), "# done\n")
    assert result.status == "ok"
    assert result.text == f"created {out / 'report' / 'r.md'} (7 bytes written)"
    assert (out / "report" / "r.md").read_text() == "# done\n"


# --- writing and patching ------------------------------------------------------------------


async def test_write_creates_parents_atomically_and_keeps_the_mode(ws: Path) -> None:
    ctx = ctx_for(ws)
    created = await write(ctx, "a/b/c.txt", "héllo")
    assert created.text == "created a/b/c.txt (6 bytes written)"
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    assert (await write(ctx, "run.sh", "#!/bin/sh\necho hi\n")).text.startswith("overwrote")
    assert stat.S_IMODE((ws / "run.sh").stat().st_mode) == 0o755
    assert not list(ws.rglob("*.tmp"))


async def test_write_over_the_cap_writes_nothing(ws: Path) -> None:
    result = await write(ctx_for(ws, write_max_bytes=10), "big.txt", "x" * 11)
    assert result.status == "error"
    assert "limit is 10 bytes" in result.text
    assert not (ws / "big.txt").exists()


async def test_write_refuses_a_directory_and_unknown_arguments(ws: Path) -> None:
    (ws / "dir").mkdir()
    ctx = ctx_for(ws)
    assert "directory" in (await write(ctx, "dir", "x")).text
    assert "directory" in (await write(ctx, ".", "x")).text
    odd = await FileWrite().run({"path": "x.txt", "content": "x", "mode": "0777"}, ctx)
    assert "unexpected argument(s) mode" in odd.text


async def test_patch_applies_edits_in_order(ws: Path) -> None:
    (ws / "app.py").write_text("a = 1\nb = 2\nc = 1\n")
    result = await patch(
        ctx_for(ws),
        "app.py",
        {"old": "b = 2", "new": "b = 3"},
        {"old": "= 1", "new": "= 0", "replace_all": True},
        {"old": "b = 3\n", "new": "b = 4\n"},
    )
    assert result.status == "ok", result.text
    assert "3 edit(s), 4 replacement(s)" in result.text
    assert (ws / "app.py").read_text() == "a = 0\nb = 4\nc = 0\n"


async def test_patch_is_all_or_nothing(ws: Path) -> None:
    original = "x = 1\nx = 1\nx = 1\ny = 2\n"
    (ws / "m.py").write_text(original)
    ctx = ctx_for(ws)
    missing = await patch(ctx, "m.py", {"old": "y = 2", "new": "y = 3"}, {"old": "zz", "new": ""})
    assert missing.status == "error"
    assert "edit 2: old text not found" in missing.text
    ambiguous = await patch(
        ctx, "m.py", {"old": "y = 2", "new": "y = 3"}, {"old": "x = 1", "new": "x"}
    )
    assert "edit 2: old text occurs 3 times" in ambiguous.text
    assert (ws / "m.py").read_text() == original


async def test_patch_refuses_non_text_and_bad_edits(ws: Path) -> None:
    (ws / "latin1.txt").write_bytes(b"caf\xe9\n")
    ctx = ctx_for(ws)
    assert "not UTF-8" in (await patch(ctx, "latin1.txt", {"old": "caf", "new": "x"})).text
    assert "does not exist" in (await patch(ctx, "nope.txt", {"old": "a", "new": "b"})).text
    assert (await FilePatch().run({"path": "hello.txt", "edits": []}, ctx)).status == "error"
    assert (await patch(ctx, "hello.txt", {"old": "", "new": "b"})).status == "error"
    assert (ws / "latin1.txt").read_bytes() == b"caf\xe9\n"


# --- searching -----------------------------------------------------------------------------


async def test_search_reports_path_line_text_and_filters_by_glob(ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("import os\ndef main():\n    return os.sep\n")
    (ws / "notes.md").write_text("os is a module\n")
    ctx = ctx_for(ws)
    result = await FileSearch().run({"pattern": r"\bos\b", "glob": "*.py"}, ctx)
    assert result.text.splitlines() == ["src/a.py:1: import os", "src/a.py:3:     return os.sep"]
    nocase = await FileSearch().run({"pattern": "DEF", "ignore_case": True}, ctx)
    assert nocase.text == "src/a.py:2: def main():"


async def test_search_caps_results_and_skips_binary_and_large_files(ws: Path) -> None:
    (ws / "many.txt").write_text("hit\n" * 50)
    (ws / "blob.bin").write_bytes(b"hit\x00" * 10)
    (ws / "huge.txt").write_text("hit\n" * 1000)
    ctx = ctx_for(ws, search_max_results=5, search_max_file_bytes=1000)
    lines = (await FileSearch().run({"pattern": "hit"}, ctx)).text.splitlines()
    assert lines[:5] == [f"many.txt:{n}: hit" for n in range(1, 6)]
    assert lines[5] == "[results capped at 5; narrow the pattern, path or glob]"
    assert lines[6] == "[skipped 1 files over the size limit and 1 binary files]"


async def test_search_does_not_follow_links_out_of_the_workspace(ws: Path, outside: Path) -> None:
    (ws / "escape").symlink_to(outside, target_is_directory=True)
    (ws / "escape.txt").symlink_to(outside / "secret.txt")
    result = await FileSearch().run({"pattern": "secret"}, ctx_for(ws))
    assert result.text == "no matches (1 files searched)"


async def test_search_refuses_a_bad_regex(ws: Path) -> None:
    result = await FileSearch().run({"pattern": "("}, ctx_for(ws))
    assert result.status == "error"
    assert "not a valid Python regular expression" in result.text


async def test_a_backtracking_pattern_ends_with_an_error_and_the_loop_runs_on(ws: Path) -> None:
    """`(a|aa)+$` on 60 a's and a '!' backtracks for hours. Under `re` the matching thread held
    the GIL throughout: the event loop (every other call, the heartbeat, this test's own
    timeout) froze. Now matching releases the GIL and gives up at the search's time limit."""
    (ws / "a.txt").write_text("a" * 60 + "!\n")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    try:
        search = FileSearch().run({"pattern": "(a|aa)+$"}, ctx_for(ws, search_timeout_seconds=1))
        result = await asyncio.wait_for(search, timeout=30)
    finally:
        ticking.cancel()
    assert result.status == "timeout"
    assert result.text.startswith("the pattern took too long: the search stopped after 1s")
    assert "(at a.txt:1)" in result.text
    assert ticks > 0  # the loop ran while the pattern was matching


async def test_a_search_stops_at_its_time_limit_between_files(ws: Path) -> None:
    (ws / "b.txt").write_text("hit\n")
    result = await FileSearch().run({"pattern": "hit"}, ctx_for(ws, search_timeout_seconds=0))
    assert result.text.startswith("[search stopped at its 0s time limit; narrow the path or glob]")


# --- the registry --------------------------------------------------------------------------


def test_registry_names_schemas_and_kinds() -> None:
    assert set(BUILTIN_TOOLS) == {
        "file.read",
        "file.write",
        "file.patch",
        "file.search",
        "shell.exec",
        "web.fetch",
    }
    assert builtin_tools().keys() == BUILTIN_TOOLS.keys()
    for name, tool in BUILTIN_TOOLS.items():
        schema = tool.definition.parameters
        assert tool.definition.name == name
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        assert set(schema["required"]) <= set(schema["properties"])
        assert tool.definition.description
    read_only = {n for n, t in BUILTIN_TOOLS.items() if t.definition.read_only}
    assert read_only == {"file.read", "file.search", "web.fetch"}
    kinds = {n: t.kind({}) for n, t in BUILTIN_TOOLS.items()}
    assert kinds == {
        "file.read": "read",
        "file.search": "read",
        "web.fetch": "read",
        "file.write": "write",
        "file.patch": "write",
        "shell.exec": "exclusive",
    }
