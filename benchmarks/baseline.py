"""Another revision's smartnsq beside the working tree's, in the same benchmark run: "measure
before and after in the same run" on a machine whose absolute figures move ±30 % from run to
run.

``baseline(rev)`` extracts the ``smartnsq`` package of git revision ``rev`` (``git archive``)
into a temporary directory and yields its label (``smartnsq@<short hash>``) and the
``PYTHONPATH`` that makes a peer process import it instead of the installed one. The
benchmark scripts of the working tree drive it, so the revision must have today's public API
(``Producer(nsqd=...)``, ``Consumer(topic, channel, handler, nsqd=...)``).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Baseline(NamedTuple):
    label: str
    #: the directory holding the revision's ``smartnsq`` package
    path: str

    def env(self) -> dict[str, str]:
        """A peer process's environment: the revision's package first on the path."""
        return {**os.environ, "PYTHONPATH": self.path}


@contextlib.contextmanager
def baseline(rev: str) -> Iterator[Baseline]:
    """The ``smartnsq`` package of ``rev``, extracted for the duration of the block."""
    try:
        short = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", f"{rev}^{{commit}}"],
                               capture_output=True, text=True, check=True).stdout.strip()
        tar = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", short, "smartnsq"],
                             capture_output=True, check=True).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"--baseline {rev}: {(exc.stderr or b'').decode().strip()}") from None
    with tempfile.TemporaryDirectory(prefix=f"smartnsq-{short}-") as path:
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(path, filter="data")
        yield Baseline(f"smartnsq@{short}", path)
