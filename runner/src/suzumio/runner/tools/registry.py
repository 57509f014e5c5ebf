"""The sandbox tools the runner offers every agent, keyed by canonical name (`file.read`).

The loop looks a call up here by name; anything not found is not a sandbox tool (a broker
tool, or unknown). Tools are stateless, so one instance serves every call and activation.
"""

from __future__ import annotations

from suzumio.runner.tools.base import SandboxTool
from suzumio.runner.tools.files import FilePatch, FileRead, FileSearch, FileWrite
from suzumio.runner.tools.shell import ShellExec
from suzumio.runner.tools.web import WebFetch


def builtin_tools() -> dict[str, SandboxTool]:
    """Fresh instances of every built-in sandbox tool, by canonical name."""
    tools: tuple[SandboxTool, ...] = (
        FileRead(),
        FileWrite(),
        FilePatch(),
        FileSearch(),
        ShellExec(),
        WebFetch(),
    )
    return {tool.definition.name: tool for tool in tools}


BUILTIN_TOOLS: dict[str, SandboxTool] = builtin_tools()
