"""``python -m smartnsq.devcluster [options]``: the same as ``smartnsq dev [options]``."""

from __future__ import annotations

import sys

from smartnsq.cli import main

if __name__ == "__main__":
    sys.exit(main(["dev", *sys.argv[1:]]))
