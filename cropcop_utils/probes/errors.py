"""The probes' one error type: a frozen split or manifest that cannot be probed.

Its own module because the classifiers, the membership probe, the metadata cue and the chapter all raise it.
"""


class ProbeInputError(ValueError):
    """The frozen split or the manifest cannot be probed (missing columns, an empty split, …)."""
