"""The one exception type for bad user input: shown as one line, exit code 2, no traceback."""


class UserError(Exception):
    """Input that tunebench refuses before doing any work (bad config, missing path, missing package)."""


def invalid(field: str, value: object, allowed: str) -> UserError:
    """A uniform message: which field, what value, what is allowed."""
    shown = value if isinstance(value, (str, int, float)) else repr(value)
    return UserError(f"invalid {field}={shown}: {allowed}")
