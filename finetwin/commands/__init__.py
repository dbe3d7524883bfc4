"""One module per command group; each has `register(app)` adding its commands to the typer app.

A command reads its options, builds its parts through `finetwin.wiring` and calls into the libraries: no
business logic here. It returns its exit status (None = 0) and raises `CommandError` for a user's mistake.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn

import typer

from finetwin import output
from finetwin.errors import CommandError

OUT_OF_MEMORY = (
    "out of memory: this machine could not give the command the memory it needed (a large input is held in "
    "memory while it is worked on): split the input, or run where more memory is free"
)


def add_command(
    app: typer.Typer,
    function: Callable[..., int | None],
    name: str,
    *,
    group: str | None = None,
    **options: Any,
) -> None:
    """Add `function` as command `name`; `group` names it in error messages (`finetwin GROUP: error: ...`)."""
    app.command(name, **options)(_reporting(group or name, function))


def _reporting(name: str, function: Callable[..., int | None]) -> Callable[..., None]:
    """The command as typer runs it: a CommandError becomes a message and exit status 2 (no traceback), and
    so does a model registry that cannot be used (`calibrate.registry.RegistryError`: its message names the
    file and what to do); a second Ctrl-C exit status 130; running out of memory or an operating system's
    error (a path that cannot be made) a message and exit status 1; output whose reader went away (`| head`)
    exit status 1 without a message; a non-zero return its exit status."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            status = function(*args, **kwargs)
        except CommandError as exc:
            output.error(name, str(exc))
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BrokenPipeError as exc:
            if output.stdout_closed():
                raise typer.Exit(1) from None
            _say_os_error(name, exc)
        except MemoryError:  # numpy's "Unable to allocate", a huge input read whole: said, not a traceback
            output.error(name, OUT_OF_MEMORY)
            raise typer.Exit(1) from None
        except OSError as exc:  # the machine's to fix (a path, a permission, a full disk): said, no traceback
            _say_os_error(name, exc)
        except Exception as exc:
            if not _is_registry_error(exc):
                raise
            output.error(name, str(exc))
            raise typer.Exit(2) from None
        if status:
            raise typer.Exit(status)

    return run


def _is_registry_error(exc: Exception) -> bool:
    from calibrate.registry import RegistryError  # here, not above: it brings numpy to every `--help`

    return isinstance(exc, RegistryError)


def _say_os_error(name: str, exc: OSError) -> NoReturn:
    where = f"{exc.filename}: " if exc.filename else ""
    output.error(name, f"{where}{exc.strerror or exc}")
    raise typer.Exit(1) from None
