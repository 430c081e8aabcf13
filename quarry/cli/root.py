"""The ``quarry`` command line's root: the app, its one error handler, the shared helpers; commands in siblings.

Every command runs through one handler (:class:`_OneErrorLine`): Quarry's errors and invalid
``QUARRY_*`` settings print one ``error (Type): message`` line and exit 2, from the ``quarry``
console script and ``python -m quarry.cli`` alike. Each run warns about ``QUARRY_*`` variables
that set nothing (a misspelling such as ``QUARRY_STORE_URL`` is otherwise ignored).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from typer.core import TyperGroup

from quarry.config_cli import app as config_app
from quarry.errors import ConfigError, QuarryError
from quarry.keys_cli import audit_app, keys_app
from quarry.plain_console import PlainConsole
from quarry.settings import Settings, get_settings, unknown_env
from quarry.triton_cli import app as triton_app


class _OneErrorLine(TyperGroup):
    """The one handler of every command: an error is one line on stderr and exit status 2."""

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context
        """Run the command; a :class:`QuarryError` or invalid settings become one ``error`` line."""
        from pydantic import ValidationError

        try:
            return super().invoke(ctx)
        except QuarryError as exc:
            _fail(exc)
        except ValidationError as exc:
            if exc.title.endswith("Settings"):
                err.print(f"[bold red]error[/] (ConfigError): {escape(settings_error(exc))}")
            else:  # stored data (a collection's config) that no longer validates: not the environment
                err.print(f"[bold red]error[/] (InternalError): {escape(stored_error(exc))}")
            raise typer.Exit(2) from None


app = typer.Typer(help="Quarry: hybrid BM25 + dense retrieval service.", no_args_is_help=True, cls=_OneErrorLine)
collections_app = typer.Typer(help="Manage collections.", no_args_is_help=True)
app.add_typer(collections_app, name="collections")
index_app = typer.Typer(help="Plan and build vector indexes by data size.", no_args_is_help=True)
app.add_typer(index_app, name="index")
app.add_typer(triton_app, name="triton")
docs_app = typer.Typer(help="List and fetch a collection's documents.", no_args_is_help=True)
app.add_typer(docs_app, name="docs")
app.add_typer(config_app, name="config")
eval_app = typer.Typer(help="Evaluate retrieval on a BEIR split (quarry eval --beir DIR); compare runs.")
app.add_typer(eval_app, name="eval")
app.add_typer(keys_app, name="keys")
app.add_typer(audit_app, name="audit")
err = PlainConsole(stderr=True, soft_wrap=True)  # an error is one line, however long
out = PlainConsole()  # piped: tables at their natural width, never cut to 80 columns

Language = Annotated[str, typer.Option(help="BM25 analysis for a new collection: en, zh or auto.")]
ServerUrl = Annotated[str | None, typer.Option(
    "--server", envvar="QUARRY_URL",
    help="A running server (http://host:port; or QUARRY_URL): go through its API (quarry_client), not local data.",
)]
ApiKey = Annotated[str | None, typer.Option("--api-key", envvar="QUARRY_API_KEY", help="With --server: the API key.")]


def _client(server: str, api_key: str | None) -> Any:
    """A :class:`quarry_client.Quarry` for ``--server``; its errors become the one error line (exit 2)."""
    try:
        from quarry_client import Quarry as Client
    except ImportError:
        raise ConfigError("--server needs the client: pip install 'quarry[client]'") from None
    return Client(server, api_key)


def _remote_error(exc: Exception) -> NoReturn:
    err.print(f"[bold red]error[/] ({escape(getattr(exc, 'type', type(exc).__name__))}): "
              f"{escape(getattr(exc, 'message', str(exc)))}")
    raise typer.Exit(2) from None


def _quarry(settings: Settings | None = None) -> Any:
    from quarry.service import Quarry

    return Quarry(settings or get_settings())


def _default_name(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_]", "_", path.resolve().name or "default")
    return stem if stem[:1].isalpha() else f"c_{stem}"


def _fail(exc: QuarryError) -> NoReturn:
    err.print(f"[bold red]error[/] ({type(exc).__name__}): {escape(str(exc))}")
    raise typer.Exit(2) from None


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            out.print(f"quarry {version('quarry')}")
        except PackageNotFoundError:
            out.print("quarry (not installed: version unknown)")
        raise typer.Exit


@app.callback()
def _main(
    _: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Quarry: hybrid BM25 + dense retrieval service."""
    for variable, close in unknown_env():
        hint = f" (did you mean {close}?)" if close else ""
        err.print(f"[yellow]warning[/] {escape(variable)} is not a Quarry setting and is ignored{escape(hint)}")




def main() -> None:
    """Entry point (the ``quarry`` script): errors are handled by :class:`_OneErrorLine`."""
    sys.exit(app())


def stored_error(exc: Any) -> str:
    """A pydantic error of stored data (a collection's config) as the fields to repair.

    E.g. ``stored CollectionConfig is invalid: dim: Input should be greater than 0 (got 0)``, not
    an environment variable that does not exist.
    """
    parts = []
    for e in exc.errors():
        name = ".".join(str(p) for p in e.get("loc", ())) or "value"
        got = f" (got {e['input']!r})" if isinstance(e.get("input"), str | int | float) else ""
        parts.append(f"{name}: {e.get('msg', 'invalid')}{got}")
    return f"stored {exc.title} is invalid: " + "; ".join(parts)


def settings_error(exc: Any) -> str:
    """A pydantic-settings error as the environment variables to fix.

    E.g. ``QUARRY_SEARCH__CANDIDATES: Input should be a valid integer (got 'abc')``.
    """
    parts = []
    for e in exc.errors():
        name = "QUARRY_" + "__".join(str(p).upper() for p in e.get("loc", ()))
        got = f" (got {e['input']!r})" if isinstance(e.get("input"), str | int | float) else ""
        parts.append(f"{name}: {e.get('msg', 'invalid')}{got}")
    return "invalid settings: " + "; ".join(parts)




# the command groups register themselves on the apps above (imported last: they import this module)
from quarry.cli import data, evaluate, ingest, rollout, serve  # noqa: E402, F401
