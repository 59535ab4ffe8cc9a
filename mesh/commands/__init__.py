"""Subcommands of the `radixmesh` CLI, one module each."""
