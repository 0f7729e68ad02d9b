"""Stands in for `python -I -m wrapper.launch.adopt` in the pi/omp extension tests: appends its
arguments (one JSON list a line) to the file $HCTX_FAKE_ADOPTER_LOG and exits at once, as the real
adopter returns once it has detached. The test plays the sidecar on the adoption's channel."""

import json
import os
import sys

with open(os.environ["HCTX_FAKE_ADOPTER_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
