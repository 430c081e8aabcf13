"""``quarry config show``: the effective settings, secrets redacted.

One ``QUARRY_...=value`` line per setting (its environment variable and the value in effect:
the environment's or the default), then what the empty defaults resolve to. A setting whose
name ends in key, token, secret or password (``..._API_KEY``; not ``MAX_TOKEN_CHARS``) shows as
``***``, and so do the password of a URL (``postgresql://user:***@host/db``) and a URL's
secret-named query parameters.
Unknown ``QUARRY_*`` variables are warned about by the ``quarry`` command itself.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import typer

from quarry.plain_console import PlainConsole
from quarry.settings import effective, get_settings
from stores.base import redact_url

app = typer.Typer(help="Show the configuration in effect.", no_args_is_help=True)
SECRET = re.compile(r"(?:\A|_)(?:key|token|secret|password|passwd|pwd)\Z", re.IGNORECASE)
MASK = "***"


def redact(name: str, value: Any) -> Any:
    """``value`` fit to print: ``***`` for a secret-named setting, URLs without their secrets.

    Args:
        name: The setting's variable (or a URL query parameter's name).
        value: Its value (JSON types).

    Returns:
        The value, or ``"***"``, or the URL with its password and secret-named parameters masked.
    """
    if SECRET.search(name.rsplit("__", 1)[-1]):
        return MASK if value not in (None, "") else value
    if isinstance(value, str) and "://" in value:
        url = redact_url(value)
        parts = urlsplit(url)
        if parts.query:
            query = [(k, MASK if SECRET.search(k) else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
            url = urlunsplit(parts._replace(query=urlencode(query, safe="*/:")))
        return url
    return value


@app.callback()
def _main() -> None:
    """Configuration commands."""


@app.command()
def show(as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of lines.")] = False) -> None:
    """Print the effective settings (environment or default), secrets redacted."""
    settings = get_settings()
    values = {name: redact(name, value) for name, value in effective(settings).items()}
    derived = {
        "store": redact("store", settings.store_url),
        "model_cache_dir": str(settings.model_cache_dir),
        "data_dir": str(settings.data_dir.resolve()),
    }
    out = PlainConsole(soft_wrap=True, highlight=False, markup=False)
    if as_json:
        out.print(json.dumps({"settings": values, "effective": derived}, indent=2))
        return
    for name, value in values.items():
        out.print(f"{name}={'' if value is None else value}")
    out.print(f"# store in effect: {derived['store']}")
    out.print(f"# data dir: {derived['data_dir']}; model cache: {derived['model_cache_dir']}")
