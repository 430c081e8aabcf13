"""Answers from an LLM over retrieved chunks: the ``Generator`` seam, prompts and citations."""
