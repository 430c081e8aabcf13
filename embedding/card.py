"""What a model declares beside its vectors: the languages it embeds well and its query/passage prefixes.

A :class:`ModelCard` comes from the model itself where it says so, else from the embedding URL:

- a sentence-transformers folder (``torch://``, ``onnx://``): its README's front matter
  ``language:`` (the Hugging Face model-card field; the packaged all-MiniLM-L6-v2 says ``en``) and
  ``config_sentence_transformers.json``'s ``prompts`` (``{"query": "query: ", "passage": ...}``;
  a ``document`` prompt counts as the passage one);
- any URL: ``languages=en,zh`` (``*``: any language the tokenizer covers; empty: not declared),
  ``query_prefix=`` and ``passage_prefix=`` (percent-encoded: ``query_prefix=query%3A%20``) override
  what the model declares.

E5 models were trained with ``query: `` before queries and ``passage: `` before documents (Wang et
al., 2022, "Text Embeddings by Weakly-Supervised Contrastive Pre-training", §4.1); a vector of a
text without its prefix is another vector. The backend prepends the prefix
(:meth:`ModelCard.prefixed`): :meth:`~embedding.base.Embedder.embed` for documents,
:meth:`~embedding.base.Embedder.embed_queries` for queries. The prefixes are part of the model's
fingerprint (:meth:`ModelCard.fold`), so a collection never holds prefixed and unprefixed vectors
side by side: the same weights with other prefixes are another model (409 ``model_mismatch``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from embedding.fingerprint import spec_fingerprint
from quarry.errors import ConfigError

log = logging.getLogger(__name__)

ANY_LANGUAGE = "*"
"""In :attr:`ModelCard.languages`: the model claims every language its tokenizer covers (multilingual)."""
CARD_OPTIONS = ("languages", "query_prefix", "passage_prefix")
"""URL query parameters any embedding URL takes (the factory strips them before the backend's own)."""
_MAX_PREFIX_CHARS = 256


@dataclass(frozen=True)
class ModelCard:
    """Languages and prefixes of an embedding model.

    Attributes:
        languages: Lower-case ISO 639-1 codes (``en``, ``zh``) of the languages the model embeds
            well; ``{"*"}``: any (a multilingual model); empty: the model declares none.
        query_prefix: Prepended to each query before it is embedded (E5: ``"query: "``).
        passage_prefix: Prepended to each document chunk (E5: ``"passage: "``).
    """

    languages: frozenset[str] = frozenset()
    query_prefix: str = ""
    passage_prefix: str = ""

    def covers(self, language: str) -> bool:
        """Whether the model declares ``language`` (an ISO 639-1 code; ``zh-Hans`` counts as ``zh``)."""
        code = language.lower().split("-")[0].split("_")[0]
        return ANY_LANGUAGE in self.languages or code in self.languages

    def prefixed(self, texts: Sequence[str], *, query: bool) -> list[str]:
        """``texts`` with the query or the passage prefix prepended (the same list when it is empty)."""
        prefix = self.query_prefix if query else self.passage_prefix
        return [prefix + t for t in texts] if prefix else list(texts)

    def fold(self, fingerprint: str) -> str:
        """The fingerprint of the model's weights with these prefixes: unchanged without prefixes.

        A model without prefixes keeps its weights' fingerprint (the collections it made stay
        its own); with prefixes it is ``prompted:sha256:<hex>`` over the weights' fingerprint and
        both prefixes. An unknown fingerprint (``""``, before ``warm_up``) stays unknown.
        """
        if not fingerprint or not (self.query_prefix or self.passage_prefix):
            return fingerprint
        return spec_fingerprint(
            "prompted", {"model": fingerprint, "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix}
        )

    def describe(self) -> dict[str, Any]:
        """JSON form: ``{"languages": [...] sorted, "query_prefix": ..., "passage_prefix": ...}``."""
        return {
            "languages": sorted(self.languages),
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
        }


@dataclass(frozen=True)
class CardOverrides:
    """What an embedding URL's ``languages``, ``query_prefix`` and ``passage_prefix`` say (``None``: not given)."""

    languages: frozenset[str] | None = None
    query_prefix: str | None = None
    passage_prefix: str | None = None

    def over(self, declared: ModelCard) -> ModelCard:
        """``declared`` with every field the URL gave replaced."""
        return replace(
            declared,
            **{k: v for k, v in vars(self).items() if v is not None},
        )


def split_card_options(url: str) -> tuple[str, CardOverrides]:
    """Take ``languages``, ``query_prefix`` and ``passage_prefix`` out of an embedding URL.

    Returns:
        The URL without them (its other parameters in their order) and what they said.

    Raises:
        ConfigError: A language that is not a 2-3 letter code or ``*``, a prefix over 256
            characters or with a control character, or one of them given twice.
    """
    parts = urlsplit(url)
    if not parts.query:
        return url, CardOverrides()
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    mine = [(k, v) for k, v in pairs if k in CARD_OPTIONS]
    if not mine:
        return url, CardOverrides()
    names = [k for k, _ in mine]
    if len(set(names)) != len(names):
        raise ConfigError(f"{sorted({n for n in names if names.count(n) > 1})} given twice in {url!r}")
    found = dict(mine)
    rest = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in pairs if k not in CARD_OPTIONS])))
    return rest, CardOverrides(
        languages=parse_languages(found["languages"], url) if "languages" in found else None,
        query_prefix=_prefix(found, "query_prefix", url),
        passage_prefix=_prefix(found, "passage_prefix", url),
    )


def parse_languages(value: str | Sequence[str], where: str) -> frozenset[str]:
    """``"en,zh"`` or ``["en", "zh"]`` -> ``{"en", "zh"}`` (lower-cased; ``*``: any; empty: none).

    Raises:
        ConfigError: An entry that is neither ``*`` nor 2-3 ASCII letters (ISO 639-1/-3).
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    out = set()
    for raw in items:
        code = str(raw).strip().lower()
        if not code:
            continue
        if code != ANY_LANGUAGE and not (code.isascii() and code.isalpha() and 2 <= len(code) <= 3):
            raise ConfigError(f"language {raw!r} in {where!r} is not an ISO 639 code (en, zh, ...) or '*'")
        out.add(code)
    return frozenset(out)


def _prefix(found: Mapping[str, str], key: str, url: str) -> str | None:
    if key not in found:
        return None
    value = found[key]
    if len(value) > _MAX_PREFIX_CHARS or any(ord(c) < 32 and c not in "\t\n" for c in value):
        raise ConfigError(f"{key} in {url!r} must be at most {_MAX_PREFIX_CHARS} printable characters")
    return value


def folder_card(root: Path) -> ModelCard:
    """The card a sentence-transformers folder declares (README front matter, ``prompts``); see the module doc.

    A missing or unreadable README or config declares nothing (an empty card), never an error.
    """
    prompts: dict[str, Any] = {}
    try:
        config = json.loads((root / "config_sentence_transformers.json").read_text(encoding="utf-8"))
        prompts = dict(config.get("prompts") or {}) if isinstance(config, dict) else {}
    except (OSError, ValueError, TypeError):
        pass
    passage = prompts.get("passage", prompts.get("document", ""))
    return ModelCard(
        languages=_readme_languages(root / "README.md"),
        query_prefix=str(prompts.get("query", "") or ""),
        passage_prefix=str(passage or ""),
    )


def _readme_languages(readme: Path) -> frozenset[str]:
    """The ``language:`` field of a model card's YAML front matter (a code or a list of codes)."""
    import yaml

    try:
        text = readme.read_text(encoding="utf-8")
    except OSError:
        return frozenset()
    if not text.startswith("---"):
        return frozenset()
    head = text[3:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(head)
        raw = meta.get("language") if isinstance(meta, dict) else None
        if raw is None:
            return frozenset()
        if raw == "multilingual" or raw == ["multilingual"]:
            return frozenset({ANY_LANGUAGE})
        return parse_languages([raw] if isinstance(raw, str) else [str(x) for x in raw], str(readme))
    except (yaml.YAMLError, ConfigError) as exc:
        log.warning("model card %s: cannot read its languages (%s); none declared", readme, exc)
        return frozenset()
