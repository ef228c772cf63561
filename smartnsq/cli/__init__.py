"""The ``smartnsq`` command line. It needs the ``cli`` extra (click and rich), which a client
library's users, such as Spark executors and web apps, do not need:
``pip install 'smartnsq[cli]'``. :func:`main` says so, instead of a traceback, when the extra
is missing; the commands live in :mod:`smartnsq.cli.app`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]

#: the ``cli`` extra's distributions, by the module each one installs
_EXTRA = {"click": "click", "rich": "rich"}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``smartnsq`` console script (and ``python -m smartnsq``)."""
    import importlib

    for module, dist in _EXTRA.items():
        try:
            importlib.import_module(module)
        except ImportError:
            sys.stderr.write(
                f"smartnsq: the command line needs the 'cli' extra ({dist} is not installed):"
                " pip install 'smartnsq[cli]'\n")
            return 1
    from smartnsq.cli.app import main as run

    return run(argv)
