"""The skeleton every service process shares: settings, logs, telemetry, connections,
health endpoints, and a SIGTERM that drains in-flight work before exiting."""

from suzumio.platform.service.bodylimit import BodyLimit, BodyLimits
from suzumio.platform.service.runtime import ServiceRuntime, run_service

__all__ = ["BodyLimit", "BodyLimits", "ServiceRuntime", "run_service"]
