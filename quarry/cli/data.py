"""``quarry search|recall|collections|docs|index``: read and manage collections (``--server``: through the API)."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from quarry.cli.root import (
    ApiKey,
    ServerUrl,
    _client,
    _quarry,
    _remote_error,
    app,
    collections_app,
    docs_app,
    err,
    index_app,
    out,
)
from quarry.errors import InvalidRequest
from quarry.settings import get_settings


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="Query text.")],
    collection: Annotated[str, typer.Option("--collection", "-c")],
    mode: Annotated[str, typer.Option(help="bm25, dense or hybrid.")] = "hybrid",
    top_k: Annotated[int, typer.Option("--top-k", "-k")] = 10,
    filters: Annotated[str | None, typer.Option(help='JSON filter, e.g. \'{"year": {"$gte": 2000}}\'.')] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw result as JSON.")] = False,
    server: ServerUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Search a collection and print the hits."""
    try:
        flt = json.loads(filters) if filters else None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"--filters is not valid JSON: {exc.msg}") from exc
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                result: Any = client.search(collection, query, top_k=top_k, mode=mode, filters=flt)
            except ClientError as exc:
                _remote_error(exc)
        hits = [h.model_dump() for h in result.hits]
    else:
        result = _quarry().search(collection, query, top_k=top_k, mode=mode, filters=flt)
        hits = [dataclasses.asdict(h) for h in result.hits]
    if as_json:
        out.file.write(json.dumps({"hits": hits, "degraded": result.degraded}, ensure_ascii=False) + "\n")
        return
    table = Table("#", "document", "score", "bm25", "dense", "text", title=escape(f"{collection}: {query!r} ({mode})"))
    for i, hit in enumerate(hits, start=1):
        ranks = {k: str(v["rank"]) for k, v in hit["explain"].items() if isinstance(v, dict) and "rank" in v}
        table.add_row(str(i), escape(hit["document_id"]), f"{hit['score']:.4f}", ranks.get("bm25", "-"),
                      ranks.get("dense", "-"), escape(hit["text"][:80].replace("\n", " ")))
    out.print(table)
    for note in result.degraded:
        err.print(f"[yellow]degraded[/]: {escape(note)}")


@app.command()
def recall(
    name: Annotated[str, typer.Argument(help="Collection.")],
    queries: Annotated[int, typer.Option("--queries", "-n", help="Queries to measure.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print the check as JSON.")] = False,
) -> None:
    """Measure recall@k of the live version's ANN index against exact search now (the recall monitor's check).

    Queries are the collection's recently sampled searches if any were recorded, else texts of
    its own chunks, searched as live searches are (at the searcher's depth); one row per
    filter-selectivity bucket.
    """
    check = _quarry().check_recall(name, queries)
    if as_json:
        out.file.write(json.dumps(dataclasses.asdict(check), ensure_ascii=False, default=str) + "\n")
        return
    title = escape(f"{name} version {check.version}: recall@k of {check.queries} queries from {check.source}, "
                   f"ANN depth {check.depth}")
    table = Table("selectivity", "queries", "mean", "p10", "min", title=title)
    for row in check.buckets:
        table.add_row(escape(row.bucket), str(row.samples), f"{row.mean_recall:.3f}", f"{row.p10_recall:.3f}",
                      f"{row.min_recall:.3f}")
    out.print(table)




@collections_app.command("list")
def list_collections(
    server: ServerUrl = None, api_key: ApiKey = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the collections as JSON.")] = False,
) -> None:
    """List collections: name, language, model, dimension (tab-separated; --json: every field)."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                found: list[Any] = client.list_collections()
            except ClientError as exc:
                _remote_error(exc)
    else:
        found = _quarry().list_collections()
    if as_json:
        rows = [cfg.model_dump(mode="json", exclude_none=True) for cfg in found]
        out.file.write(json.dumps({"collections": rows}, ensure_ascii=False, default=str) + "\n")
        return
    for cfg in found:
        out.file.write(f"{cfg.name}\t{cfg.language}\t{cfg.embedding_model}\t{cfg.dim}\n")  # tabs kept: cut -f


@collections_app.command("describe")
def describe_collection(
    name: str, server: ServerUrl = None, api_key: ApiKey = None,
    as_json: Annotated[bool, typer.Option("--json", help="One line of JSON (default: indented JSON).")] = False,
) -> None:
    """Show a collection's configuration, index and counts (JSON)."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                described: dict[str, Any] = client.describe(name).model_dump(mode="json", exclude_none=True)
            except ClientError as exc:
                _remote_error(exc)
    else:
        described = _quarry().describe(name)
    if as_json:
        out.file.write(json.dumps(described, ensure_ascii=False, default=str) + "\n")
        return
    out.print_json(json.dumps(described, default=str))


@collections_app.command("create")
def create_collection(
    name: str, language: Annotated[str, typer.Option(help="BM25 analysis: en, zh or auto.")] = "auto",
    server: ServerUrl = None, api_key: ApiKey = None,
) -> None:
    """Create an empty collection (quarry ingest creates one too)."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                client.create_collection(name, language=language)
            except ClientError as exc:
                _remote_error(exc)
    else:
        _quarry().create_collection(name, language=language)
    out.print(f"created {name}", soft_wrap=True, highlight=False, markup=False)


@collections_app.command("drop")
def drop_collection(name: str, server: ServerUrl = None, api_key: ApiKey = None) -> None:
    """Drop a collection and all its data."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                client.drop_collection(name)
            except ClientError as exc:
                _remote_error(exc)
    else:
        _quarry().drop_collection(name)
    out.print(f"dropped {name}", soft_wrap=True, highlight=False, markup=False)


@docs_app.command("list")
def list_docs(
    collection: Annotated[str, typer.Option("--collection", "-c")],
    cursor: Annotated[str | None, typer.Option(help="The next_cursor of the previous page.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Documents per page.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as JSON.")] = False,
    server: ServerUrl = None,
    api_key: ApiKey = None,
) -> None:
    """List a collection's documents in id order (id, chunks, metadata), a page at a time."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                page = client.list_documents(collection, cursor=cursor, limit=limit)
            except ClientError as exc:
                _remote_error(exc)
        docs, next_cursor = [d.model_dump() for d in page.documents], page.next_cursor
    else:
        docs, next_cursor = _quarry().list_documents(collection, cursor=cursor, limit=limit)
    if as_json:
        out.file.write(json.dumps({"documents": docs, "next_cursor": next_cursor}, ensure_ascii=False) + "\n")
        return
    for doc in docs:
        out.print(f"{doc['id']}\t{doc['chunks']} chunks\t{json.dumps(doc['metadata'], ensure_ascii=False)}",
                  soft_wrap=True, highlight=False, markup=False)
    if next_cursor is not None:
        err.print(f"more: --cursor {escape(next_cursor)}", soft_wrap=True)


@docs_app.command("get")
def get_doc(
    document_id: Annotated[str, typer.Argument(help="The document's id.")],
    collection: Annotated[str, typer.Option("--collection", "-c")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the document, its chunks included, as JSON.")] = False,
    server: ServerUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Print a document: its text (its chunks' texts joined) and metadata."""
    if server is not None:
        from quarry_client import QuarryError as ClientError

        with _client(server, api_key) as client:
            try:
                doc = client.get_document(collection, document_id).model_dump()
            except ClientError as exc:
                _remote_error(exc)
    else:
        doc = _quarry().get_document(collection, document_id)
    if as_json:
        out.file.write(json.dumps(doc, ensure_ascii=False) + "\n")
        return
    out.print(f"{doc['id']} {json.dumps(doc['metadata'], ensure_ascii=False)}", soft_wrap=True, highlight=False,
              markup=False)
    out.print(doc["text"], soft_wrap=True, highlight=False, markup=False)


@index_app.command("plan")
def index_plan(
    vectors: Annotated[int | None, typer.Option(help="Planned vector count (default: the collection's).")] = None,
    dim: Annotated[int | None, typer.Option(help="Vector dimension (default: the collection's).")] = None,
    collection: Annotated[str | None, typer.Option("--collection", "-c")] = None,
    budget_gib: Annotated[float | None, typer.Option(help="Memory budget, GiB.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show the index the planner picks for this store, with its reasons and memory estimate."""
    plan = _plan(vectors, dim, collection, budget_gib)[1]
    from indexing.planner import format_plan

    out.print_json(json.dumps(plan.to_dict())) if as_json else out.print(format_plan(plan))


@index_app.command("apply")
def index_apply(
    collection: Annotated[str, typer.Option("--collection", "-c")],
    vectors: Annotated[int | None, typer.Option(help="Planned size (default: current vector count).")] = None,
    budget_gib: Annotated[float | None, typer.Option()] = None,
) -> None:
    """Build the planned index on a collection (timeout and rollback: QUARRY_STORE__INDEX_BUILD_TIMEOUT_S)."""
    quarry, plan = _plan(vectors, None, collection, budget_gib)
    quarry.apply_index(collection, plan)
    out.print(f"[green]built[/] {plan.spec.kind} on {collection}: {plan.reason}")


def _plan(vectors: int | None, dim: int | None, collection: str | None, budget_gib: float | None) -> tuple[Any, Any]:
    from indexing.index_sizing import GIB
    from indexing.planner import plan_for_store
    from quarry.errors import InvalidRequest

    settings = get_settings()
    quarry = _quarry(settings)
    if collection is not None:
        cfg = quarry.get_collection(collection)
        dim = dim or cfg.dim
        vectors = quarry.store.count(collection) if vectors is None else vectors
    if vectors is None or dim is None:
        raise InvalidRequest("give --collection, or both --vectors and --dim")
    budget = int((budget_gib or settings.store.memory_budget_gib) * GIB)
    return quarry, plan_for_store(quarry.store, vectors, dim, budget, top_k=settings.search.candidates)


