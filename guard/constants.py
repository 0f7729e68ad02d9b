"""The record's constants: their own values, deliberately not aliases of anything else (HC-R04)."""

from typing import Final

__all__ = [
    "ACCEPTED_SCHEMAS",
    "AGENTS_DIR_NAME",
    "CHANNEL_DROP_REPORT",
    "CHANNEL_MAX_FRAME_BYTES",
    "CHANNEL_MAX_SOCKET_PATH",
    "CONTEXT_LOCK_NAME",
    "CONTEXT_RECORD_NAME",
    "CONTROL_DIR_NAME",
    "HARNESS_CONTEXT_BUCKET_PERCENT",
    "HARNESS_CONTEXT_FUTURE_SKEW_MS",
    "HARNESS_CONTEXT_HEADROOM_WARN_PERCENT",
    "HARNESS_CONTEXT_HEARTBEAT_MS",
    "HARNESS_CONTEXT_STALE_MS",
    "HARNESS_CONTEXT_WARN_PERCENT",
    "LOGS_DIR_NAME",
    "MAX_RECORD_BYTES",
    "MAX_STATE_BYTES",
    "OWN_FRAME_PREFIX",
    "REPLICATED_RECORD_NAMES",
    "SCHEMA_V1",
    "SCHEMA_V2",
    "STAGING_DIR_NAME",
    "STATE_LOCK_NAME",
    "STATE_RECORD_NAME",
    "STATE_SCHEMA",
    "WRAPPER_LOCK_NAME",
]

SCHEMA_V1: Final = "st2.harness-context.v1"
SCHEMA_V2: Final = "st2.harness-context.v2"
ACCEPTED_SCHEMAS: Final = frozenset({SCHEMA_V1, SCHEMA_V2})
STATE_SCHEMA: Final = "st2.harness-state.v1"

HARNESS_CONTEXT_STALE_MS: Final = 60 * 60 * 1000
# Records are a few hundred bytes; anything past this is not a record and is not read whole.
MAX_RECORD_BYTES: Final = 64 * 1024
# A harness-state claim's bound, with its history.
MAX_STATE_BYTES: Final = 256 * 1024
HARNESS_CONTEXT_FUTURE_SKEW_MS: Final = 60 * 1000
HARNESS_CONTEXT_BUCKET_PERCENT: Final = 1
HARNESS_CONTEXT_WARN_PERCENT: Final = 80
# Doctor advises when the headroom to the harness's own compaction point (compactAtTokens) is below
# this share of the window: about one large turn left. hctx's number, like the 80; the point itself
# is the harness's.
HARNESS_CONTEXT_HEADROOM_WARN_PERCENT: Final = 10
HARNESS_CONTEXT_HEARTBEAT_MS: Final = 300 * 1000

# The names the replication transport's include list must carry (HC-T08). Renaming one here
# without the other side silently stops replication, so a test pins these exact strings.
CONTEXT_RECORD_NAME: Final = "harness-context"
STATE_RECORD_NAME: Final = "harness-state"
REPLICATED_RECORD_NAMES: Final = (STATE_RECORD_NAME, CONTEXT_RECORD_NAME)
CONTEXT_LOCK_NAME: Final = ".harness-context.lock"
# Wrappers claim, relaunch and stop an agent under this lock, so two never both hold its claim.
STATE_LOCK_NAME: Final = ".harness-state.lock"
# The one wrapper running an agent holds this lock for as long as it runs: the proof a takeover asks
# for before it signals anything (a pid in a claim anyone can write proves nothing).
WRAPPER_LOCK_NAME: Final = ".harness-wrapper.lock"
CONTROL_DIR_NAME: Final = ".st2"
STAGING_DIR_NAME: Final = "harness-context-staging"
AGENTS_DIR_NAME: Final = "agents"
LOGS_DIR_NAME: Final = "logs"

# The channel's wire limits, shared by the sidecar that listens and the wrapper that taps into it.
CHANNEL_MAX_FRAME_BYTES: Final = 1024 * 1024
# AF_UNIX sun_path is 108 bytes including the terminating NUL.
CHANNEL_MAX_SOCKET_PATH: Final = 107
# Frame types the sidecar reserves for itself: the channel refuses them, except the drop report a
# tap (the wrapper's copy of a harness's stdout) sends for lines it could not deliver.
OWN_FRAME_PREFIX: Final = "hctx."
CHANNEL_DROP_REPORT: Final = "hctx.dropped"
