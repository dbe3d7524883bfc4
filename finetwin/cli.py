"""The `finetwin` console script: a typer app whose commands live one group per module in
`finetwin/commands/`. Each command builds its parts through `finetwin.wiring` and calls into the
libraries; a user's mistake is printed on stderr without a traceback (exit status 2).

Command modules import only typer-level things at the top so `finetwin --help` stays fast; heavy imports
(pandas, scikit-learn, Kafka, FastAPI) happen inside the commands.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from finetwin import output
from finetwin.commands import (
    advise,
    api,
    calibrate,
    info,
    keys,
    migrate,
    models,
    plan,
    prune,
    report,
    telemetry,
    twin,
    up,
)  # fmt: skip
from finetwin.help_format import flags_take_no_value
from finetwin.logs import configure_logging
from finetwin.settings import Settings
from twin.input_errors import plain_message

flags_take_no_value()
app = typer.Typer(
    name="finetwin",
    help="A digital twin for GPU clusters that run LLM fine-tuning jobs.",
    no_args_is_help=True,
    add_completion=True,  # `finetwin --install-completion` (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

Verbose = Annotated[
    int, typer.Option("-v", "--verbose", count=True, help="libraries' logs too (-v info, -vv debug)")
]


def _settings() -> Settings:
    """The settings from the environment (a .env file is not read); one that is invalid is named by its
    variable, with what it must be, and every command stops with status 2 (it was a pydantic traceback)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return Settings()
    except ValidationError as exc:
        problems = [_setting_problem(error) for error in exc.errors()]
    except SettingsError as exc:  # a list or mapping setting that is not JSON: pydantic-settings' own error
        problems = [_unparsed_setting(str(exc))]
    typer.echo(f"finetwin: error: invalid setting: {'; '.join(problems)}", err=True)
    raise typer.Exit(2) from None


def _unparsed_setting(message: str) -> str:
    """pydantic-settings' 'error parsing value for field "refit_benchmarks" from source ...' as the variable
    and what it must be."""
    field = re.search(r'field "([^"]+)"', message)
    name = f"FINETWIN_{field.group(1).upper()}" if field else "a FINETWIN_ variable"
    return f'{name}: must be JSON (a list is written as \'["a.csv", "b.csv"]\')'


# Settings whose values are not repeated in a message: a database URL may hold a password.
_UNECHOED = ("url", "password", "secret", "token")


def _setting_problem(error: Any) -> str:
    name = "_".join(str(part) for part in error["loc"]).upper()
    said = f"FINETWIN_{name}: {plain_message(error['msg'])}"
    value = error.get("input")
    if isinstance(value, str | int | float) and not any(word in name.lower() for word in _UNECHOED):
        said += f" (got {value!r})"
    return said


def _print_version(value: bool) -> None:
    if value:
        from finetwin.info import describe

        describe(_settings(), with_counts=False)
        raise typer.Exit()


VersionFlag = Annotated[
    bool,
    typer.Option(
        "--version", callback=_print_version, is_eager=True, help="version, data directory and store in use"
    ),
]


@app.callback()
def _root(ctx: typer.Context, verbose: Verbose = 0, version: VersionFlag = False) -> None:
    configure_logging(verbose)
    ctx.obj = _settings()  # the one settings object, passed down to every part


for group in (telemetry, up, calibrate, models, twin, plan, api, keys, advise, report, migrate, prune, info):
    group.register(app)


def command() -> Any:
    """The click command behind the typer app (tests resolve deploy files' command lines with it)."""
    return typer.main.get_command(app)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; returns its exit status (usage errors are printed by typer, status 2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        app(args=args, prog_name="finetwin")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    else:
        status = 0
    try:  # what is still buffered (typer's --help): its reader may have gone too (`| head`)
        if sys.stdout is not None:  # None: started with its output closed
            sys.stdout.flush()
    except BrokenPipeError:
        if output.stdout_closed():
            return 1
        raise
    return status


if __name__ == "__main__":
    sys.exit(main())
