"""The runner: the program inside an activation's sandbox (DESIGN.md §7, §9).

It depends on `suzumio.contracts` alone, so its image stays small.
"""
