"""OpenAI's ``/v1/models`` and ``/v1/embeddings`` over the collections a key may read.

A model is a collection: its id is ``quarry/<collection>``, the ``model`` that
``/v1/chat/completions`` answers over and ``/v1/embeddings`` embeds with (the collection's own
embedding model; a bare ``<collection>`` is accepted there too). So an OpenAI client pointed at
Quarry (``base_url=http://host:8000/v1``) lists, retrieves and uses them as it would OpenAI's:
``client.models.list()``, ``client.models.retrieve("quarry/docs")``,
``client.embeddings.create(model="quarry/docs", input=[...])``.

Scope: every route needs ``read``; a key sees its tenant's collections (and the shared ones),
and a key limited to some collections sees those only; another tenant's collection is a 404
as a missing one is. Errors use the one envelope, which OpenAI's clients read as theirs
(``error.type``, ``error.message``; an unsupported parameter adds ``param`` and ``code``).

``/v1/embeddings``: ``input`` a string or a list of strings (token arrays are refused), at
most ``QUARRY_OPENAI__MAX_EMBEDDING_INPUTS`` texts of at most ``__MAX_EMBEDDING_CHARS``
characters, none blank; ``encoding_format`` ``float`` or ``base64`` (little-endian float32, what
the official client asks for by default and decodes); ``dimensions`` only as the model's own.
``usage.prompt_tokens`` is estimated (one token per 3 characters, or per CJK character:
:func:`generation.prompt.approx_tokens`; the embedders expose no token count). Quarry's
extension ``quarry.input_type`` (``document``, the default, or ``query``) picks the model's
passage or query prefix; ``quarry.truncated`` lists the inputs cut to the model's
``max_seq_length``.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from generation.prompt import approx_tokens
from indexing.collections import CollectionConfig, check_name_length
from indexing.docstore import off_loop
from indexing.document_rules import is_blank
from quarry import errors as e
from quarry.api import access, edge
from quarry.api.deps import STORE_ERRORS, Service
from quarry.api.edge import Checked, Identifier
from quarry.api.errors import error_responses
from quarry.api.models import _Body
from quarry.errors import InvalidRequest, UnsupportedParameter, clip
from quarry.service import Quarry
from quarry.services import collections
from quarry.services.embeddings import embed

router = APIRouter()

PREFIX = "quarry/"
OWNER = "quarry"


class ModelOut(BaseModel):
    """One OpenAI model: a collection."""

    id: str = Field(description='"quarry/<collection>"')
    object: Literal["model"] = "model"
    created: int = Field(description="The collection's creation time (Unix seconds).")
    owned_by: str = Field(description='"quarry"')


class ModelsOut(BaseModel):
    """OpenAI's model list."""

    object: Literal["list"] = "list"
    data: list[ModelOut]


def _model(cfg: CollectionConfig) -> dict[str, Any]:
    return {"id": PREFIX + cfg.name, "object": "model", "created": int(cfg.created_at), "owned_by": OWNER}


def collection_of(model: str, field: str = "model") -> str:
    """The collection a model id names (``quarry/<collection>``, or a bare ``<collection>``).

    Raises:
        InvalidRequest: Not a collection name.
    """
    name = model.removeprefix(PREFIX)
    if not name:
        raise InvalidRequest(f'{field} must be "quarry/<collection>", got {clip(model)}')
    check_name_length(name)
    edge.name(name, f"collection name of the {field}")
    return name


@router.get("/v1/models", tags=["openai"], response_model=ModelsOut)
def list_models(request: Request, q: Service) -> dict[str, Any]:
    """The collections the key may read, as OpenAI models (``client.models.list()``)."""
    return {"object": "list", "data": [_model(c) for c in q.list_collections() if access.allowed(request, c.name)]}


@router.get(
    "/v1/models/{model:whole}", tags=["openai"], response_model=ModelOut,
    responses=error_responses(e.InvalidRequest, e.Forbidden, e.CollectionNotFound, *STORE_ERRORS),
)
def retrieve_model(
    model: Annotated[str, Path(min_length=1, examples=["quarry/docs"])], request: Request, q: Service
) -> dict[str, Any]:
    """One collection as an OpenAI model (``client.models.retrieve("quarry/<collection>")``).

    Raises:
        CollectionNotFound: No such collection for this key's tenant.
        Forbidden: The key is limited to other collections.
    """
    name = collection_of(model)
    access.check_collection(request, name)
    view = q.for_collection(name)
    return _model(collections.get(view.view, name))


class EmbeddingsOptions(_Body):
    """Quarry's own knobs of an embeddings request (the body's ``quarry`` field)."""

    input_type: Literal["document", "query"] = Field(
        "document", description="The model's passage prefix (document) or its query prefix (query)."
    )


class EmbeddingsIn(Checked):
    """``POST /v1/embeddings``: OpenAI's request, ``model`` a collection."""

    parsed_later = frozenset({"input"})  # its own checks name the input at fault

    model_config = ConfigDict(extra="allow")

    model: Identifier = Field(description='"quarry/<collection>" (or "<collection>")')
    input: str | list[Any] = Field(description="A text or a list of texts.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="Only the model's own dimension.")
    user: str | None = Field(None, max_length=256)
    quarry: EmbeddingsOptions = EmbeddingsOptions()

    def texts(self, max_inputs: int, max_chars: int) -> list[str]:
        """The texts to embed.

        Raises:
            InvalidRequest: No text, more than ``max_inputs``, a text that is not a string (token
                arrays), blank, or longer than ``max_chars``.
        """
        texts = [self.input] if isinstance(self.input, str) else list(self.input)
        if not texts:
            raise InvalidRequest("input: no text to embed")
        if len(texts) > max_inputs:
            raise InvalidRequest(
                f"input: {len(texts)} texts, at most {max_inputs} per request (QUARRY_OPENAI__MAX_EMBEDDING_INPUTS)"
            )
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidRequest(f"input[{i}]: a string is expected (token arrays are not supported)")
            if is_blank(text):
                raise InvalidRequest(f"input[{i}]: blank text")
            if len(text) > max_chars:
                raise InvalidRequest(
                    f"input[{i}]: {len(text)} characters, at most {max_chars} (QUARRY_OPENAI__MAX_EMBEDDING_CHARS)"
                )
            edge.text(text, f"input[{i}]")
        return texts


@router.post(
    "/v1/embeddings", tags=["openai"],
    responses=error_responses(
        e.InvalidRequest, e.UnsupportedParameter, e.Forbidden, e.CollectionNotFound, e.ModelMismatch,
        e.EmbeddingUnavailable, e.EmbeddingError, *STORE_ERRORS, body=True,
    ),
)
async def create_embeddings(body: EmbeddingsIn, request: Request, q: Service) -> dict[str, Any]:
    """Embed texts with a collection's model (``client.embeddings.create(model="quarry/<collection>", ...)``).

    Returns OpenAI's ``{object: "list", data: [{object: "embedding", index, embedding}], model,
    usage: {prompt_tokens, total_tokens}}`` plus ``quarry: {embedding_model, input_type, truncated}``.

    Raises:
        InvalidRequest: See :meth:`EmbeddingsIn.texts`; a bad model name.
        UnsupportedParameter: ``dimensions`` other than the model's.
        CollectionNotFound: No such collection for this key's tenant.
        Forbidden: The key is limited to other collections.
        EmbeddingUnavailable, EmbeddingError: The model failed.
    """
    name = collection_of(body.model)
    access.check_collection(request, name)
    limits = q.settings.openai
    texts = body.texts(limits.max_embedding_inputs, limits.max_embedding_chars)
    scoped: Quarry = await off_loop(q.for_collection, name)
    done = await off_loop(embed, scoped.view, name, texts, body.quarry.input_type)
    vectors = done.embeddings.vectors
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise UnsupportedParameter(
            f"dimensions={body.dimensions}: the collection's model gives {vectors.shape[1]} (no other is supported)",
            param="dimensions",
        )
    data = [
        {"object": "embedding", "index": i,
         "embedding": _encoded(row, body.encoding_format)}
        for i, row in enumerate(vectors)
    ]
    tokens = sum(approx_tokens(t) for t in texts)
    truncated = [i for i, cut in enumerate(done.embeddings.truncated) if cut]
    return {
        "object": "list", "data": data, "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "quarry": {"embedding_model": done.model_id, "input_type": body.quarry.input_type, "truncated": truncated},
    }


def _encoded(row: Any, encoding: str) -> list[float] | str:
    """A vector as OpenAI sends it: floats, or base64 of its little-endian float32 bytes."""
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in row]
