"""``python -m smartnsq``: the ``smartnsq`` command line."""

import sys

from smartnsq.cli import main

if __name__ == "__main__":
    sys.exit(main())
