"""The latency worker's entry point (see :func:`.chapter.measure`): one JSON spec in, one JSON line out."""

import json
import sys

from .chapter import latency_worker

print(json.dumps(latency_worker(json.loads(sys.argv[1]))))
