"""NATS in trouble: failures that say nothing about the request — the server slow, restarting
or unreachable, a connection reconnecting, a stream electing its leader. What failed this way
may pass when asked again; a refusal would not. (Timeouts, nats' own included, are OSErrors.)
"""

from __future__ import annotations

import nats.errors
import nats.js.errors

NATS_TROUBLE: tuple[type[Exception], ...] = (
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoServersError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    # No stream answered a publish: after a NATS restart a memory stream (LIVE) is gone until
    # the services make it again (within seconds); in a cluster, a stream electing its leader.
    nats.js.errors.NoStreamResponseError,
)
