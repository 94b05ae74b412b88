"""``ConfigError``, the one exception a bad configuration raises.

It sits apart from the modules that word it so the file source, the wording and the route
resolution can all raise it without importing each other.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration problem, stated in one line that is safe to print."""
