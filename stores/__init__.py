"""stores package."""
