"""rerank package."""
