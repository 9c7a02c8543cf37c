"""The one exception type users see: it names the field and the value that were wrong."""


class ShardplanError(ValueError):
    """A user-facing input error; the CLI prints ``str(err)`` on one line and exits with 2."""

    def __init__(self, field: str, value: object, reason: str):
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")


def from_validation_error(err) -> ShardplanError:
    """A pydantic ``ValidationError`` as the one-line error: a validator's own ShardplanError when
    it raised one, else the first error's field, input and message."""
    first = err.errors()[0]
    if isinstance((first.get("ctx") or {}).get("error"), ShardplanError):  # a validator's own one-line error
        return first["ctx"]["error"]
    field = ".".join(str(p) for p in first["loc"]) or err.title
    return ShardplanError(field, first.get("input"), first["msg"])
