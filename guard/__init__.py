"""The harness-context record and its discipline: model, projection, write policy, store.

Stdlib and pydantic only: no trio, no network. Everything else in hctx imports this.
"""

__version__ = "0.1.0"
