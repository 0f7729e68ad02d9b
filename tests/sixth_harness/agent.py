"""The sixth harness's agent: a session that fills its window, compacts once, and exits.

Run as `sixth-agent` (a symlink the test makes) or `python agent.py`; it reports on $HCTX_CHANNEL.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

FILLS = (1_000, 40_000, 90_000, 12_000)
WINDOW = 100_000


def main() -> int:
    with socket.socket(socket.AF_UNIX) as channel:
        channel.connect(os.environ["HCTX_CHANNEL"])
        for index, used in enumerate(FILLS):
            if index == 3:
                channel.sendall(b'{"type":"sixth.compacted"}\n')
            channel.sendall(json.dumps({"type": "sixth.usage", "used": used, "window": WINDOW}).encode() + b"\n")
            time.sleep(0.05)
    print("sixth agent done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
