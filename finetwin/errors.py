"""The one error a command raises for a mistake of its user."""

from __future__ import annotations


class CommandError(Exception):
    """A user error a command reports on stderr with exit status 2, without a traceback."""
