"""The public REST API (FastAPI): `/v1/...`, problems as application/problem+json."""
