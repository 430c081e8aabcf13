"""The API's routers, one module per resource; :func:`quarry.api.app.create_app` includes :data:`ROUTERS`.

Every router in :data:`ROUTERS` passes the same dependencies (the parameter check, then the
access layer); a route's scope is in :data:`quarry.api.access.POLICY`.
"""

from fastapi import APIRouter

from quarry.api import answer
from quarry.api.routes import (
    audit,
    collections,
    console,
    documents,
    feedback,
    jobs,
    openai,
    ops,
    reports,
    rollout,
    search,
)

ROUTERS: tuple[APIRouter, ...] = (
    ops.router, collections.router, jobs.router, documents.router, search.router, feedback.router, answer.router,
    audit.router, reports.router, console.router, rollout.router, openai.router,
)

__all__ = ["ROUTERS"]
