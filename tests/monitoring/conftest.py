"""The core tests' fixtures these tests share: the counting MiniLM and the SciFact documents."""

from tests.core.conftest import counting, scifact_docs  # noqa: F401 - fixtures, registered by the import
