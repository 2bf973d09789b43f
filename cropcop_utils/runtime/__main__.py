"""The latency worker's entry point (see :func:`.latency.measure`): one JSON spec in, one JSON line out."""

import json
import sys

from .latency import latency_worker

print(json.dumps(latency_worker(json.loads(sys.argv[1]))))
