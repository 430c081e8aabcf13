"""``quarry keys create|list|revoke`` and ``quarry audit list``: the access layer's admin commands.

They open only the state of record (never the vector store), so they run beside a serving
process; a key created or revoked here counts on the server's next request.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from indexing.docstore import AuditEntry, StateStore, open_docstore
from quarry.errors import NotFound
from quarry.plain_console import PlainConsole
from quarry.settings import get_settings

keys_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
audit_app = typer.Typer(help="The admin audit log.", no_args_is_help=True)
out = PlainConsole()


def _state() -> StateStore:
    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return open_docstore(
        settings.docstore.url, settings.data_dir,
        pool_size=2, connect_timeout_s=settings.docstore.connect_timeout_s, timeout_s=settings.docstore.timeout_s,
    )


@keys_app.command("create")
def create(  # noqa: PLR0913 - the key's attributes
    tenant: Annotated[str, typer.Option(help="Tenant the key belongs to (created if new).")] = "default",
    scopes: Annotated[
        str, typer.Option(help="Comma-separated: read, write, admin, metrics (GET /metrics only: for Prometheus).")
    ] = "read",
    collections: Annotated[str | None, typer.Option(help="Comma-separated collections (default: all).")] = None,
    rate: Annotated[str | None, typer.Option(help="Request rate, e.g. 50/s or 600/min (default: unlimited).")] = None,
    tokens: Annotated[
        str | None,
        typer.Option(help="LLM token quota of the answer path, e.g. 20000/min (default: unlimited)."),
    ] = None,
    priority: Annotated[str, typer.Option(help="high, normal or low (load shedding).")] = "normal",
    expires: Annotated[str | None, typer.Option(help="Lifetime, e.g. 30d, 12h (default: never).")] = None,
    name: Annotated[str, typer.Option(help="A label shown by 'keys list'.")] = "",
) -> None:
    """Create a key and print it once (only its scrypt hash is stored)."""
    from quarry.api.keys import new_key, parse_duration, parse_rate

    key, record = new_key(
        tenant, [s.strip() for s in scopes.split(",") if s.strip()],
        collections=[c.strip() for c in collections.split(",") if c.strip()] if collections else None,
        rate=parse_rate(rate), token_rate=parse_rate(tokens, "token rate"), priority=priority,
        expires_in_s=parse_duration(expires) if expires else None,
        name=name,
    )
    state = _state()
    try:
        if tenant not in {t for t, _ in state.list_tenants()}:
            state.create_tenant(tenant, tenant)
        state.insert_api_key(record)
        state.append_audit(AuditEntry(action="key.create", tenant_id=tenant, target=record.id,
                                      detail={"scopes": record.scopes, "by": "cli"}))
    finally:
        state.close()
    typer.echo(key)
    typer.echo(f"key id {record.id}, tenant {tenant}: shown once, store it now", err=True)


@keys_app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List keys (id, tenant, scopes, limits, state); never the key itself."""
    from quarry.api.keys import PRIORITIES

    state = _state()
    try:
        records = state.list_api_keys(tenant)
    finally:
        state.close()
    names = {v: k for k, v in PRIORITIES.items()}
    now = time.time()
    rows: list[dict[str, Any]] = [
        {
            "id": r.id, "tenant": r.tenant_id, "name": r.name, "scopes": r.scopes, "collections": r.collections,
            "rate_per_s": r.rate,
            "tokens_per_min": None if r.token_rate is None else round(r.token_rate * 60, 3),
            "priority": names.get(r.priority, str(r.priority)),
            "state": "revoked" if r.revoked_at else "expired" if r.expires_at and r.expires_at <= now else "active",
            "created": _iso(r.created_at), "expires": _iso(r.expires_at),
        }
        for r in records
    ]
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table(
        "id", "tenant", "name", "scopes", "collections", "rate/s", "tokens/min", "priority", "state", "expires"
    )
    for row in rows:
        table.add_row(
            row["id"], row["tenant"], row["name"], ",".join(row["scopes"]), ",".join(row["collections"] or ["*"]),
            "-" if row["rate_per_s"] is None else f"{row['rate_per_s']:g}",
            "-" if row["tokens_per_min"] is None else f"{row['tokens_per_min']:g}", row["priority"], row["state"],
            row["expires"] or "-",
        )
    out.print(table)


@keys_app.command("revoke")
def revoke(key_id: Annotated[str, typer.Argument(help="The key's id (or the whole qk_<id>_… key).")]) -> None:
    """Revoke a key: its next request is refused (401), on every server sharing this state."""
    key_id = key_id.removeprefix("qk_").split("_", 1)[0]
    state = _state()
    try:
        record = state.get_api_key(key_id)
        if record is None:
            raise NotFound(f"no API key with id {key_id!r}")
        if state.revoke_api_key(key_id):
            state.append_audit(AuditEntry(action="key.revoke", tenant_id=record.tenant_id, target=key_id,
                                          detail={"by": "cli"}))
            typer.echo(f"revoked {key_id}")
        else:
            typer.echo(f"{key_id} was already revoked")
    finally:
        state.close()


@audit_app.command("list")
def audit_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's entries.")] = None,
    since: Annotated[str | None, typer.Option(help="Only entries newer than this, e.g. 24h, 7d.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Admin actions (collection create/drop, key create/revoke), oldest first: when, who, what."""
    from quarry.api.keys import parse_duration

    start = time.time() - parse_duration(since) if since else 0.0
    state = _state()
    try:
        entries = state.list_audit(tenant_id=tenant, since=start, limit=limit)
    finally:
        state.close()
    rows: list[dict[str, Any]] = [
        {"at": _iso(a.at), "action": a.action, "key_id": a.key_id, "tenant": a.tenant_id, "target": a.target,
         "detail": a.detail}
        for a in entries
    ]
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("at", "action", "key", "tenant", "target", "detail")
    for row in rows:
        table.add_row(row["at"], row["action"], row["key_id"] or "-", row["tenant"] or "-", row["target"] or "-",
                      json.dumps(row["detail"]) if row["detail"] else "")
    out.print(table)


def _iso(at: float | None) -> str:
    return "" if not at else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
