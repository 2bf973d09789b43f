"""``python -m cropcop_utils.training``: train one model of a run (see ``.chapter.main``)."""

import sys

from .chapter import main

sys.exit(main())
