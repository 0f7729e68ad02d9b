"""The harnesses' modules: each defines its typed events, its decoding half, its producer and its
`HarnessSpec`. Which module serves which harness is `sidecar.registry`'s table, not this package's."""
