"""The read models the gateway serves, built by the projector this service hosts.

Each is registered under the `suzumio.projections` entry point group (see pyproject.toml), and
its tables live in the schema `proj_<name>`; docs/projections.md lists the columns.
"""
