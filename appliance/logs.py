"""The one logging set-up of every Mediaplane service (interop.md 1: stderr, journald on the appliance).

Both ``mp-edge`` and ``mp-manager`` call :func:`configure_service_logging`, so the format,
the access log's level and the libraries kept quiet are the same everywhere.
"""

from __future__ import annotations

import logging
import sys
from typing import Final

__all__ = ["LOG_FORMAT", "SECRET_QUOTING_LIBRARIES", "configure_service_logging"]

LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Their DEBUG lines quote header values, so a secret: hpack the Cookie and Authorization of
# HTTP/2 requests (hypercorn speaks HTTP/2), httpcore the response headers of an outbound
# call (an AI provider, a manager) that may echo a key. Never below WARNING, whatever
# --log-level says (style.md 5: secrets never reach a log line).
SECRET_QUOTING_LIBRARIES: Final = ("hpack", "httpcore")


def configure_service_logging(level: str) -> None:
    """Logs to stderr at ``level`` (``debug``, ``info``, ``warning`` or ``error``).

    One access-log line per request only at ``debug`` (journald stays readable).
    """
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("mediaplane.access").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
    for library in SECRET_QUOTING_LIBRARIES:
        logging.getLogger(library).setLevel(logging.WARNING)
