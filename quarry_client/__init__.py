"""Quarry's Python client: :class:`Quarry` (sync) and :class:`AsyncQuarry` (asyncio), on httpx.

    from quarry_client import Quarry, errors

    with Quarry("http://127.0.0.1:8000", api_key="qk_...") as q:
        q.ensure_collection("notes", language="en")
        q.upsert("notes", [{"id": "n1", "text": "Tides follow the moon."}])
        for hit in q.search("notes", "moon", top_k=3).hits:
            print(hit.document_id, hit.score)
        try:
            q.search("nope", "moon")
        except errors.CollectionNotFound as exc:
            print(exc.message)

It imports only httpx, pydantic and tenacity (``pip install 'quarry[client]'``), never the
server's packages. Errors are :mod:`quarry_client.errors`' classes, named as the server's.
"""

from quarry_client import errors
from quarry_client.aio import AsyncQuarry
from quarry_client.errors import QuarryError
from quarry_client.models import (
    Answer,
    AnswerEvent,
    Collection,
    Document,
    DocumentPage,
    DocumentSummary,
    Job,
    SearchResult,
    WriteReport,
)
from quarry_client.sync import Quarry

__all__ = [
    "Quarry", "AsyncQuarry", "QuarryError", "errors", "Answer", "AnswerEvent", "Collection", "Document",
    "DocumentPage", "DocumentSummary", "Job", "SearchResult", "WriteReport",
]
