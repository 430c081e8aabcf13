"""``quarry rollout start|step|promote|abort|show|report NAME``: a collection's gray release on local data.

Acts on the state of record as the REST routes do (:mod:`quarry.services.rollout`); a running
server sees each change on its next search (the state's change token). The decisions go to the
audit log without a key (the CLI is the operator's). ``report`` writes the A/B report (HTML, or
JSON); the live-traffic figures are a serving process's, so ``--server`` asks a running server for
them (``GET …/rollout/report?format=json``, rendered here); without it only the record and its
decisions (each gate evaluation's figures) are in it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from indexing.rollout import DEFAULT_SCHEDULE, Rollout
from quarry.cli.root import ApiKey, ServerUrl, _quarry, _remote_error, app, out
from quarry.errors import ConfigError, InvalidRequest

rollout_app = typer.Typer(help="Gray release of a collection's next version: shadow, canary %, gates, rollback.",
                          no_args_is_help=True)
app.add_typer(rollout_app, name="rollout")

Name = Annotated[str, typer.Argument(help="The collection.")]


def _line(r: Rollout) -> str:
    last = r.decisions[-1] if r.decisions else {}
    share = f" {r.percent:g} %" if r.state == "canary" else ""
    return (f"{r.collection}: {r.state}{share} (candidate version {r.candidate}, live {r.baseline}); "
            f"last: {last.get('action', '-')}: {escape(str(last.get('reason', '')))}")


@rollout_app.command("start")
def start(  # noqa: PLR0913 - the command's options
    name: Name,
    model: Annotated[str | None, typer.Option(help="Another embedding model's URL (default: the live one's).")] = None,
    index: Annotated[str, typer.Option(help="auto (the planner's) or a kind: flat, hnsw, ivf_flat, ...")] = "auto",
    shadow: Annotated[bool, typer.Option("--shadow", help="Start in shadow mode (compare only).")] = False,
    schedule: Annotated[str, typer.Option(help="The ramp in percent, comma-separated, ending at 100.")] = ",".join(
        f"{p:g}" for p in DEFAULT_SCHEDULE),
    step_samples: Annotated[int, typer.Option(help="Queries each step is held for before its gates.")] = 200,
    shadow_rate: Annotated[float, typer.Option(help="Share of queries also run on the other version.")] = 0.05,
    auto: Annotated[bool, typer.Option("--auto", help="Advance (and promote) when a step's gates pass.")] = False,
    gates: Annotated[str | None, typer.Option(help='Gate bounds as JSON, e.g. {"min_recall": 0.95}.')] = None,
) -> None:
    """Build a candidate version (as a reindex, without the swap) and start its shadow or canary."""
    from quarry.services import rollout

    try:
        steps = [float(p) for p in schedule.split(",") if p.strip()]
        bounds = json.loads(gates) if gates else None
    except ValueError as exc:
        raise InvalidRequest(f"--schedule or --gates: {exc}") from exc
    quarry = _quarry()
    try:
        started = rollout.start(quarry.view, name, model=model, index=index, mode="shadow" if shadow else "canary",
                                schedule=steps, step_samples=step_samples, shadow_rate=shadow_rate, auto=auto,
                                gates=bounds)
    finally:
        quarry.close()
    out.print(_line(started))


def _act(name: str, action: str) -> None:
    from quarry.services import rollout

    quarry = _quarry()
    try:
        view = quarry.view
        if action == "step":
            done = rollout.step(view, name)
        elif action == "promote":
            done = rollout.promote(view, name)
        elif action == "abort":  # waits out the searches in flight on the candidate, then drops it
            done = rollout.abort(view, name, reason="asked (CLI)", wait=True)
        else:
            done = rollout.get(view, name)
    finally:
        quarry.close()
    out.print(_line(done))


@rollout_app.command("step")
def step(name: Name) -> None:
    """Move the rollout to its next share (a shadow becomes a canary)."""
    _act(name, "step")


@rollout_app.command("promote")
def promote(name: Name) -> None:
    """Make the candidate the live version."""
    _act(name, "promote")


@rollout_app.command("abort")
def abort(name: Name) -> None:
    """Roll back: the live version serves everything; the candidate is dropped."""
    _act(name, "abort")


@rollout_app.command("show")
def show(name: Name) -> None:
    """The collection's newest rollout, one line."""
    _act(name, "show")


def _remote_report(server: str, api_key: str | None, name: str) -> dict[str, Any]:
    """The JSON report of a running server (the figures of the queries it served)."""
    try:
        import httpx

        from quarry_client._core import headers_for, seg
        from quarry_client.errors import error_from_response
    except ImportError:
        raise ConfigError("--server needs the client: pip install 'quarry[client]'") from None
    try:
        resp = httpx.get(f"{server.rstrip('/')}/v1/collections/{seg(name)}/rollout/report",
                         params={"format": "json"}, headers=headers_for(api_key), timeout=120.0)
    except httpx.HTTPError as exc:
        raise ConfigError(f"could not reach {server}: {exc}") from exc
    if resp.status_code != 200:
        _remote_error(error_from_response(resp))
    found: dict[str, Any] = resp.json()
    return found


@rollout_app.command("report")
def report(
    name: Name,
    out_file: Annotated[Path | None, typer.Option("--out", help="Write it to this file (default: print it).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The JSON object instead of the HTML page.")] = False,
    server: ServerUrl = None,
    api_key: ApiKey = None,
) -> None:
    """The A/B report: live vs candidate side by side, and a paired test of the shadowed queries."""
    from eval.rollout_report import render_rollout_html, with_paired, write_rollout_report
    from quarry.services import rollout_report

    if server is not None:
        found = _remote_report(server, api_key, name)
    else:
        quarry = _quarry()
        try:
            found = rollout_report.report(quarry.view, name)
        finally:
            quarry.close()
    found = found if "paired" in found else with_paired(found)
    if out_file is not None:
        write_rollout_report(found, out_file, as_json=as_json)
        out.print(escape(f"{name}: A/B report written to {out_file}"))
        return
    out.file.write(json.dumps(found, indent=2, default=str) + "\n" if as_json else render_rollout_html(found))
