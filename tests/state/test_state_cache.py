"""The hot reads' cache and its change token, on both backends: replicas sharing a state see each other's commits.

Two opened stores of one state are two replicas (two processes' pools, two PostgreSQL listeners).
While nothing is committed a cached read asks nothing; a commit through the other replica moves
the token (SQLite: ``PRAGMA data_version`` at once; PostgreSQL: its ``NOTIFY``, delivered to the
listener within milliseconds), and the next read is fresh: a key revoked on one replica is refused
on the other, a key created there makes the open server require keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from indexing.docstore import CacheMiss, StateStore, cache_only
from quarry.api.access import Access
from quarry.api.keys import KeyVerifier, new_key
from quarry.errors import Unauthenticated
from quarry.settings import AuthSettings


def _moved(state: StateStore, before: int | None, bound_s: float = 5.0) -> None:
    """Wait until ``state``'s change token differs from ``before`` (a NOTIFY's delivery on PostgreSQL)."""
    deadline = time.monotonic() + bound_s
    while state.change_token() == before:
        assert time.monotonic() < deadline, "the change token did not move"
        time.sleep(0.005)


def _listening(state: StateStore) -> None:
    deadline = time.monotonic() + 10
    while state.change_token() is None:
        assert time.monotonic() < deadline, "no change listener"
        time.sleep(0.01)


def test_a_cached_config_asks_nothing_until_another_replica_commits(opened: Callable[[], StateStore]) -> None:
    one, two = opened(), opened()
    _listening(one)
    one.put_collection("c", {"v": 1})
    assert one.collection_config("c") == {"v": 1} and one.version("c") == 0 and one.collection_state("c")
    with cache_only():  # a hit needs no query: the event loop may read it
        assert one.collection_config("c") == {"v": 1} and one.version("c") == 0
        assert one.collection_state("c") is not None
        with pytest.raises(CacheMiss):
            one.list_collections()  # not cached: it would have to ask
    before = one.change_token()
    two.put_collection("c", {"v": 2})
    _moved(one, before)
    with pytest.raises(CacheMiss):
        with cache_only():
            one.collection_config("c")
    assert one.collection_config("c") == {"v": 2}


def test_a_revoke_on_one_replica_is_refused_on_the_other(opened: Callable[[], StateStore]) -> None:
    one, two = opened(), opened()
    _listening(one)
    key, record = new_key("default", ["read"])
    before = one.change_token()
    two.insert_api_key(record)
    _moved(one, before)
    verifier = KeyVerifier(one)
    reads: list[str] = []
    real: Any = one.get_api_key
    one.get_api_key = lambda key_id: (reads.append(key_id), real(key_id))[1]  # type: ignore[method-assign]
    for _ in range(5):
        assert verifier.verify(key).scopes == {"read"}
    assert len(reads) == 1  # cached while nothing is committed
    before = one.change_token()
    assert two.revoke_api_key(record.id)
    _moved(one, before)
    with pytest.raises(Unauthenticated, match="revoked at"):
        verifier.verify(key)


def test_a_key_created_on_another_replica_makes_keys_required(opened: Callable[[], StateStore]) -> None:
    one, two = opened(), opened()
    _listening(one)
    gate = Access(one, AuthSettings())
    assert not gate.keys_required()
    with cache_only():
        assert not gate.keys_required()  # answered from the token: no query
    before = one.change_token()
    two.insert_api_key(new_key("default", ["read"])[1])
    _moved(one, before)
    assert gate.keys_required()
