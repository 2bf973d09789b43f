"""The audit's one error type: input that does not match what the audit needs."""


class AuditInputError(ValueError):
    """The corpus manifest or an image does not match what the audit needs (names the file / fix)."""
