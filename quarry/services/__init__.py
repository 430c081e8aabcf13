"""Application services: one per concern, above the domain packages and below the adapters (api, cli)."""
