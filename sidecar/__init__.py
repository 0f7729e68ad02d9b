"""The trio sidecar: one per wrapped harness incarnation, the only writer of its agent's record."""
