"""``smartnsq`` in shell pipelines and scripts, as an operator writes them: what its stdout
carries (data only), which nsqd it says it cannot reach, against the embedded cluster.

Each command runs as the real entry point in a bash subprocess; the invariant: stdout holds
only the command's data, every diagnostic goes to stderr (or nowhere when stderr is
closed), no traceback, each within its stated time.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

from tests.cli_support import WAIT, ClusterThread, closed_port, cluster_fixture

SMARTNSQ = f"{shlex.quote(sys.executable)} -m smartnsq"

stock = cluster_fixture("stock", nodes=1)


def sh(script: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run a bash script as a user types it; one still running after the bound is killed
    whole (its own process group) and fails the test."""
    proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", script],
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(input, timeout=WAIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {WAIT} s: {script}\n{err.decode()}") \
            from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_closed_stderr_keeps_diagnostics_out_of_stdout(stock: ClusterThread) -> None:
    """``2>&-`` (a script that closed stderr): the warnings and the error line went to
    stdout, into the data a pipeline reads (Python has no ``sys.stderr`` then, and
    ``print(file=None)`` writes to stdout). They go nowhere now; the exit codes stay."""
    gone = closed_port()
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    cases = [
        (f"tail t --nsqd {gone} --connect-timeout 0.3", 1),
        (f"publish t --nsqd {gone}", 1),
        (f"publish t --nsqd {nsqd} --no-such-flag", 2),
        ("no-such-command", 2),
    ]
    for cmd, code in cases:
        r = sh(f"{SMARTNSQ} {cmd} 2>&-", input=b"x\n")
        assert (r.returncode, r.stdout) == (code, b""), (cmd, r.stdout)
