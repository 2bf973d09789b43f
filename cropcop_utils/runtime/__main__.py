"""The latency worker's entry point (see :func:`.latency.measure_all`): one JSON spec in, "ready" once the
imports are done, then (after "go" on stdin) one JSON line out."""

import json
import sys

from .latency import latency_worker, wait_for_turn

print(json.dumps(latency_worker(json.loads(sys.argv[1]), wait_for_turn)), flush=True)
