"""An example Suzumio toolpack: a todo list kept in the session's workspace.

`manifest.MANIFEST` is what the platform reads (entry point group `suzumio.toolpacks`). Each
other module runs in one place only, and imports nothing of that place: `tools` in the runner,
`support` in the tool-broker, `hooks` in the scheduler.
"""
