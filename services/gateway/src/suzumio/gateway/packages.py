"""Agent packages: an archive (tar, tar.gz or zip) holding an agent's definition.

    agent.yaml              name, role, model, fallbacks, tools, toolpacks, runtime_profile,
                            workspace_mode, permissions, description (and optionally prompt)
    prompt/system.md        the system prompt
    tools.yaml              extra tool names (a list, or {tools: [...]})
    env/env_facts.yaml      facts about the environment, a flat mapping of strings
    anything else           assets: stored content-addressed, listed on the agent

Everything may sit under one top folder. Archives are checked before anything is stored:
bounded size and entry count, only regular files and folders, no absolute paths, no `..`.
The YAML files are bounded too (size, nesting) and may not use anchors or aliases.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import lzma
import posixpath
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from yaml.composer import ComposerError

from suzumio.contracts.values import (
    MAX_ENV_FACTS,
    MAX_FACT_CHARS,
    MAX_PERMISSIONS,
    ModelSpec,
    Name,
    Slug,
    ToolPolicy,
    ToolRef,
    WorkspaceMode,
)

MAX_ENTRIES = 2_000
MAX_UNPACKED_BYTES = 100 * 1024 * 1024
MAX_EXTENDED_HEADER = 64 * 1024
MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_DEPTH = 32
MAX_TOOLS = 200
MAX_TOOL_CHARS = 200
MAX_PROMPT_CHARS = 1_000_000
BLOCK = 512
KNOWN = {"agent.yaml", "prompt/system.md", "tools.yaml", "env/env_facts.yaml"}


class PackageError(ValueError):
    """The archive is not a valid agent package; the message says why."""


class Manifest(BaseModel):
    """`agent.yaml`."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    role: Name
    description: str = Field(default="", max_length=10_000)
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    model: ModelSpec | str
    fallbacks: list[ModelSpec | str] = Field(default_factory=list, max_length=16)
    tools: list[ToolRef] = Field(default_factory=list, max_length=MAX_TOOLS)
    toolpacks: list[ToolRef] = Field(default_factory=list, max_length=100)
    runtime_profile: Slug | None = None
    workspace_mode: WorkspaceMode = WorkspaceMode.COPY
    permissions: dict[ToolRef, ToolPolicy] = Field(default_factory=dict, max_length=MAX_PERMISSIONS)


@dataclass
class Asset:
    path: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class Package:
    fields: dict[str, Any]  # the CreateAgent fields the package defines
    assets: list[Asset]


def _model(value: ModelSpec | str) -> ModelSpec:
    return ModelSpec(name=value) if isinstance(value, str) else value


def _entries(data: bytes) -> dict[str, bytes]:
    try:
        if zipfile.is_zipfile(io.BytesIO(data)):
            return _zip_entries(data)
        raw = _decompressed(data)
        _check_tar_headers(raw)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as archive:
            return _tar_entries(archive)
    except PackageError:
        raise
    except (
        tarfile.TarError,
        zipfile.BadZipFile,
        EOFError,
        OSError,
        NotImplementedError,
        RuntimeError,
        ValueError,
        zlib.error,
        lzma.LZMAError,
    ) as exc:
        raise PackageError(f"the archive is damaged or unsupported ({type(exc).__name__})") from exc


def _decompressed(data: bytes) -> bytes:
    """The tar stream inside an optional gzip/bz2/xz layer, refused past the unpacked limit
    (so a small bomb never fills memory)."""
    limit = MAX_UNPACKED_BYTES + MAX_ENTRIES * 1_024
    if data[:2] == b"\x1f\x8b":
        decompressor: Any = zlib.decompressobj(wbits=31)
    elif data[:3] == b"BZh":
        decompressor = bz2.BZ2Decompressor()
    elif data[:6] == b"\xfd7zXZ\x00":
        decompressor = lzma.LZMADecompressor()
    else:
        return data
    out = decompressor.decompress(data, limit + 1)
    if len(out) > limit:
        raise PackageError(f"a package unpacks to at most {MAX_UNPACKED_BYTES} bytes")
    return bytes(out)


def _check_tar_headers(raw: bytes) -> None:
    """Refuse oversized extended headers before tarfile reads them whole into memory."""
    offset, entries = 0, 0
    while offset + BLOCK <= len(raw):
        header = raw[offset : offset + BLOCK]
        if header == b"\0" * BLOCK:
            return
        entries += 1
        if entries > MAX_ENTRIES * 2:
            raise PackageError(f"a package has at most {MAX_ENTRIES} entries")
        size = _octal(header[124:136])
        if header[156:157] in {b"x", b"g", b"L", b"K"} and size > MAX_EXTENDED_HEADER:
            raise PackageError("the archive has an oversized extended header")
        offset += BLOCK + -(-size // BLOCK) * BLOCK


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # base-256 encoding of a large size
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip() or b"0"
    try:
        return int(text, 8)
    except ValueError as exc:
        raise PackageError("the archive has a corrupt header") from exc


def _safe(name: str) -> str | None:
    norm = posixpath.normpath(name.replace("\\", "/"))
    if name.startswith("/") or norm.startswith("..") or "\x00" in name:
        raise PackageError(f"archive entry {name!r} leaves the package")
    try:
        name.encode()
    except UnicodeEncodeError:
        # tarfile keeps a name's non-UTF-8 bytes as lone surrogates: as an asset's path the
        # command could not even be written out (a 500), and no one sent that name.
        raise PackageError(f"archive entry {name!r} has a name that is not UTF-8") from None
    return None if norm in {".", ""} else norm


def _tar_entries(archive: tarfile.TarFile) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    for i, member in enumerate(archive):
        if i >= MAX_ENTRIES:
            raise PackageError(f"a package has at most {MAX_ENTRIES} entries")
        name = _safe(member.name)
        if member.isdir() or name is None:
            continue
        if not member.isfile():
            raise PackageError(f"archive entry {member.name!r} is not a regular file")
        total += member.size
        if total > MAX_UNPACKED_BYTES:
            raise PackageError(f"a package unpacks to at most {MAX_UNPACKED_BYTES} bytes")
        handle = archive.extractfile(member)
        files[name] = handle.read() if handle else b""
    return files


def _zip_entries(data: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise PackageError(f"a package has at most {MAX_ENTRIES} entries")
        if sum(i.file_size for i in infos) > MAX_UNPACKED_BYTES:
            raise PackageError(f"a package unpacks to at most {MAX_UNPACKED_BYTES} bytes")
        for info in infos:
            name = _safe(info.filename)
            if info.is_dir() or name is None:
                continue
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise PackageError(f"archive entry {info.filename!r} is a symlink")
            files[name] = archive.read(info)
    return files


def _strip_top_folder(files: dict[str, bytes]) -> dict[str, bytes]:
    if "agent.yaml" in files:
        return files
    tops = {name.split("/", 1)[0] for name in files}
    if len(tops) == 1 and all("/" in n for n in files):
        return {name.split("/", 1)[1]: body for name, body in files.items()}
    return files


class _PlainLoader(yaml.SafeLoader):
    """`safe_load`'s loader without anchors and aliases (a few bytes of them stand for
    gigabytes once the values are walked) and with bounded nesting (the composer recurses)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        mark = event.start_mark if isinstance(event.start_mark, yaml.Mark) else None
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ComposerError(None, None, "anchors and aliases are not allowed", mark)
        if self._depth >= MAX_YAML_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _yaml(files: dict[str, bytes], name: str) -> Any:
    if len(files[name]) > MAX_YAML_BYTES:
        raise PackageError(f"{name} is larger than {MAX_YAML_BYTES} bytes")
    try:
        return yaml.load(files[name].decode("utf-8"), Loader=_PlainLoader)  # noqa: S506 - safe
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PackageError(f"{name} is not valid YAML: {exc}") from exc
    except RecursionError as exc:  # a backstop: the depth limit should come first
        raise PackageError(f"{name} is nested too deeply") from exc


def _env_facts(raw: Any) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise PackageError("env/env_facts.yaml must be a mapping")
    if len(raw) > MAX_ENV_FACTS:
        raise PackageError(f"env/env_facts.yaml holds at most {MAX_ENV_FACTS} facts")
    facts: dict[str, str] = {}
    for key, value in raw.items():
        if isinstance(key, list | dict) or isinstance(value, list | dict):
            raise PackageError("env/env_facts.yaml must map names to plain values")
        name, text = str(key), str(value)
        if len(name) > MAX_FACT_CHARS or len(text) > MAX_FACT_CHARS:
            raise PackageError(f"an env fact is longer than {MAX_FACT_CHARS} characters")
        facts[name] = text
    return facts


def read_package(data: bytes) -> Package:
    """Parse and check an agent package archive."""
    files = _strip_top_folder(_entries(data))
    if "agent.yaml" not in files:
        raise PackageError("the package has no agent.yaml")
    try:
        manifest = Manifest.model_validate(_yaml(files, "agent.yaml"))
    except ValidationError as exc:
        # Where and why, not the values: a prompt of megabytes, or a secret pasted in the
        # wrong field, would come back in the answer (and any log of it).
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        raise PackageError(f"agent.yaml: {errors}") from exc
    prompt = manifest.prompt or ""
    if "prompt/system.md" in files:
        prompt = files["prompt/system.md"].decode("utf-8", "replace")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise PackageError(f"prompt/system.md is longer than {MAX_PROMPT_CHARS} characters")
    tools = list(manifest.tools)
    if "tools.yaml" in files:
        declared = _yaml(files, "tools.yaml")
        declared = declared.get("tools", []) if isinstance(declared, dict) else declared
        if not isinstance(declared, list) or not all(isinstance(t, str) for t in declared):
            raise PackageError("tools.yaml must list tool names")
        tools += [t for t in declared if t not in tools]
        if len(tools) > MAX_TOOLS or any(len(t) > MAX_TOOL_CHARS for t in tools):
            raise PackageError(
                f"an agent lists at most {MAX_TOOLS} tools, "
                f"each at most {MAX_TOOL_CHARS} characters"
            )
    env_facts: dict[str, str] = {}
    if "env/env_facts.yaml" in files:
        env_facts = _env_facts(_yaml(files, "env/env_facts.yaml") or {})
    fields = {
        "name": manifest.name,
        "role": manifest.role,
        "description": manifest.description,
        "prompt": prompt,
        "model": _model(manifest.model),
        "fallbacks": tuple(_model(m) for m in manifest.fallbacks),
        "tools": tuple(tools),
        "toolpacks": tuple(manifest.toolpacks),
        "runtime_profile": manifest.runtime_profile,
        "workspace_mode": manifest.workspace_mode,
        "permissions": manifest.permissions,
        "env_facts": env_facts,
    }
    assets = [Asset(name, body) for name, body in sorted(files.items()) if name not in KNOWN]
    _check_nesting([a.path for a in assets])
    return Package(fields, assets)


def _check_nesting(paths: list[str]) -> None:
    """Refuse an asset under another one's path (`a` and `a/b`, which an archive can hold):
    no workspace can hold both, and every activation of the agent would fail to set them out."""
    names = set(paths)
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if (above := "/".join(parts[:i])) in names:
                raise PackageError(f"archive entry {path!r} lies under the file {above!r}")
