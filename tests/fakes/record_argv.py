"""A stand-in adopter for tests: appends its argv as one JSON line to the file $RECORD_ARGV names."""

import json
import os
import sys

with open(os.environ["RECORD_ARGV"], "a") as out:
    out.write(json.dumps(sys.argv[1:]) + "\n")
sys.exit(int(os.environ.get("RECORD_ARGV_STATUS", "0")))
