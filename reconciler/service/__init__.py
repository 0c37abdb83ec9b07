"""The long-running service (``triton-gitops run``): scheduler, watch,
webhooks, metrics and health endpoints."""
