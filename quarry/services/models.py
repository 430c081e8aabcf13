"""The embedding models a service serves, by fingerprint: its own, and those versions of collections name.

A collection version records its model's URL and fingerprint (:mod:`indexing.versions`); a
search or a write of that version needs that model, which after a reindex to another model
need not be the server's own.
"""

from __future__ import annotations

import threading

from embedding.base import Embedder, QueryEncoder
from embedding.batching import BatchingEmbedder
from embedding.factory import open_embedder
from indexing.docstore import CollectionVersion
from quarry.errors import ModelMismatch
from quarry.settings import Settings


def fingerprint_of(model: Embedder) -> str:
    """A model's fingerprint, or ``""`` while it is unknown (a remote model not yet reached)."""
    try:
        return model.fingerprint
    except Exception:  # noqa: BLE001 - unknown until warm: the searcher's model check decides
        return ""


class ModelRegistry:
    """The service's model and the others, opened once each and kept by fingerprint.

    Thread-safe; shared by every tenant's view.

    Args:
        settings: The configuration (``embedding.url``: the service's own model's URL).
        embedder: The service's embedder.
        query_embedder: Its query encoder (batched, or in a child process).
    """

    def __init__(self, settings: Settings, embedder: Embedder, query_embedder: QueryEncoder) -> None:  # noqa: D107
        self.settings = settings
        self.embedder = embedder
        self.query_embedder = query_embedder
        self._models: dict[str, tuple[Embedder, QueryEncoder]] = {}  # fingerprint -> other models
        self._urls: dict[str, str] = {}  # URL -> fingerprint of models registered by hand
        self._guard = threading.Lock()

    def url_of(self, fingerprint: str | None) -> str | None:
        """The service's model URL when ``fingerprint`` is its embedder's (or unknown), else ``None``."""
        mine = fingerprint_of(self.embedder)
        return self.settings.embedding.url if fingerprint is None or not mine or fingerprint == mine else None

    def model_for(self, version: CollectionVersion) -> tuple[Embedder, QueryEncoder]:
        """The embedder and query encoder of ``version``'s model, chosen by fingerprint.

        The service's own model when the fingerprints agree, when either is unknown (a remote
        model not yet reached), or when the version's URL is the service's own (then the
        ingestor's and the searcher's model checks refuse a model that computes other vectors);
        else the model at the version's URL, opened once and checked.

        Raises:
            ModelMismatch: The version's model cannot be opened, or computes something else.
        """
        mine = fingerprint_of(self.embedder)
        wanted = version.model_fingerprint
        if not wanted or not mine or wanted == mine or version.model_name in (None, self.settings.embedding.url):
            return self.embedder, self.query_embedder
        with self._guard:
            known = self._models.get(wanted)
            if known is not None:
                return known
            if not version.model_name:
                raise ModelMismatch(version.physical_name, "unknown", self.embedder.model_id,
                                    stored_fingerprint=wanted, current_fingerprint=mine)
            return self._open(version.model_name, wanted)

    def for_reindex(self, live: CollectionVersion, url: str | None) -> tuple[Embedder, str | None]:
        """The embedder a reindex of ``live`` builds with, and its URL (``url=None``: the live one's)."""
        if url is None:
            return self.model_for(live)[0], live.model_name
        with self._guard:
            fingerprint = self._urls.get(url)
            if fingerprint is not None and fingerprint in self._models:
                return self._models[fingerprint][0], url
            if url == self.settings.embedding.url:
                self.embedder.warm_up()
                return self.embedder, url
            return self._open(url)[0], url

    def register(self, url: str, model: Embedder) -> None:
        """Use ``model`` (warmed up here) for versions whose fingerprint is its own, as if opened from ``url``."""
        model.warm_up()
        with self._guard:
            self._models[model.fingerprint] = (model, BatchingEmbedder(model))
            self._urls[url] = model.fingerprint

    def _open(self, url: str, fingerprint: str | None = None) -> tuple[Embedder, QueryEncoder]:
        """Open (and warm) the model at ``url``; keep it by fingerprint (the caller holds the guard).

        Raises:
            ModelMismatch: Its fingerprint is not ``fingerprint``.
        """
        model = open_embedder(url, self.settings)
        model.warm_up()
        if fingerprint is not None and model.fingerprint != fingerprint:
            raise ModelMismatch(url, url, model.model_id, stored_fingerprint=fingerprint,
                                current_fingerprint=model.fingerprint)
        pair: tuple[Embedder, QueryEncoder] = (model, BatchingEmbedder(model))
        self._models[model.fingerprint] = pair
        return pair
