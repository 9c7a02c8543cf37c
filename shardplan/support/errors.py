"""The one exception type users see: it names the field and the value that were wrong."""


class ShardplanError(ValueError):
    """A user-facing input error; the CLI prints ``str(err)`` on one line and exits with 2."""

    def __init__(self, field: str, value: object, reason: str):
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={safe_repr(value)}: {reason}")


MAX_SHOWN_CHARS = 200  # a value longer than this is shown by its ends and its length (one line)


def safe_repr(value: object) -> str:
    """``repr(value)`` on one line, shortened when long; never raises (an int past Python's 4,300-digit
    limit, an object whose ``__repr__`` fails)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits>"
    try:
        text = repr(value)
    except Exception as err:  # noqa: BLE001 - any failing __repr__: name the type instead
        return f"<{type(value).__name__} ({type(err).__name__} in repr)>"
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_SHOWN_CHARS else f"{text[:120]}…{text[-40:]} ({len(text)} chars)"


def from_validation_error(err) -> ShardplanError:
    """A pydantic ``ValidationError`` as the one-line error: a validator's own ShardplanError when
    it raised one, else the first error's field, input and message."""
    first = err.errors()[0]
    if isinstance((first.get("ctx") or {}).get("error"), ShardplanError):  # a validator's own one-line error
        return first["ctx"]["error"]
    field = ".".join(str(p) for p in first["loc"]) or err.title
    return ShardplanError(field, first.get("input"), first["msg"])


def require_type(value: object, expected: type | tuple[type, ...], field: str, hint: str = "") -> None:
    """A public function's argument of the wrong type as the one error type (not a TypeError deep inside)."""
    if not isinstance(value, expected):
        names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
        raise ShardplanError(field, safe_repr(value) if len(safe_repr(value)) <= 60 else type(value).__name__,
                             f"expected a {names}{'; ' + hint if hint else ''}")
