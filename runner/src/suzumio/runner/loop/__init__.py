"""The agent loop: turns, tool rounds, compaction, failures (DESIGN.md §9, Appendix A)."""
