"""One exception hierarchy for smartnsq.

Everything the library raises derives from :class:`NSQError`. Errors that come from an nsqd
error frame are :class:`ServerError` subclasses chosen by the frame's code; they say whether
the server closes the connection after them (``fatal``, which depends on the server flavour
and on the command they answer) and whether "refresh the lookup and retry" can fix them
(``refresh_lookup``).
"""

from __future__ import annotations

from smartnsq.errors import base, ports, server
from smartnsq.errors.base import *  # noqa: F403  (each module lists what it defines)
from smartnsq.errors.ports import *  # noqa: F403
from smartnsq.errors.server import *  # noqa: F403

#: every error class (and Flavour): what smartnsq exports too
__all__: list[str] = []
__all__ += base.__all__
__all__ += server.__all__
__all__ += ports.__all__
