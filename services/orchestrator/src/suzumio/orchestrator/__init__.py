"""The orchestrator service: launches, watches and cancels activations on sandbox backends
(DESIGN.md §8)."""
