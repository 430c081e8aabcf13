"""Application services: what the REST API, the CLI, the scheduler and ``quarry eval`` call.

Each module holds one concern and takes the caller's :class:`~quarry.services.view.View` (which
tenant, which collections' namespace, which engines) explicitly; none imports HTTP types. The
layers and the flows are drawn in ``docs/architecture.md``.
"""
