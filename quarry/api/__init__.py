"""The REST API (FastAPI): ``create_app`` builds it around a :class:`quarry.service.Quarry`."""

from quarry.api.app import create_app

__all__ = ["create_app"]
