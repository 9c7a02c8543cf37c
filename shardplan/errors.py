"""The one exception type users see: it names the field and the value that were wrong."""


class ShardplanError(ValueError):
    """A user-facing input error; the CLI prints ``str(err)`` on one line and exits with 2."""

    def __init__(self, field: str, value: object, reason: str):
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")
