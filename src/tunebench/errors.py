"""The one exception type for bad user input: shown as one line, exit code 2, no traceback."""

from __future__ import annotations

import importlib


class UserError(Exception):
    """Input that tunebench refuses before doing any work (bad config, missing path, missing package)."""


def invalid(field: str, value: object, allowed: str) -> UserError:
    """A uniform message: which field, what value, what is allowed."""
    shown = value if isinstance(value, (str, int, float)) else repr(value)
    return UserError(f"invalid {field}={shown}: {allowed}")


def require(module: str, why: str, install: str | None = None) -> None:
    """Refuse with one line when an optional package is missing (or broken, which is the same to a user)."""
    try:
        importlib.import_module(module)
    except Exception:
        raise UserError(f"{why} needs the '{module}' package, which is not installed "
                        f"({install or 'pip install ' + module})") from None
