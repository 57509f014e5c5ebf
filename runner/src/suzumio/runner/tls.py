"""One TLS context for the runner's HTTP clients, made once per process.

Building one loads the CA bundle (about 20 ms); a runner makes a client for the broker and one
per model. Made at import, it is made once in a fork server and shared by every runner forked
from it.
"""

from __future__ import annotations

import ssl

import certifi

CONTEXT = ssl.create_default_context(cafile=certifi.where())
