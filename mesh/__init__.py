"""The top floor: the `radixmesh` CLI, the launcher, the in-process engine, load generation.

It may import every room; nothing below imports it.
"""
