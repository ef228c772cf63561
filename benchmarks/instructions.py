"""Client instructions per message, counted by valgrind (callgrind): repeatable where CPU
seconds on this machine move by ±30 % from run to run.

Each (scenario, client) runs twice under ``valgrind --tool=callgrind`` as the throughput
benchmark runs it (the peer script in its own process, against the same nsqd), with N and
2N messages; the difference of the two totals divided by N is the cost of one message
without the interpreter's start-up, imports and connection set-up. The nsqd is another
process and is not counted. Printed per scenario: smartnsq's and the raw asyncio loop's
instructions per message (the raw loop being the floor of the same wire, as in
``throughput.py``) and their ratio.

Usage: python benchmarks/instructions.py --nsqd HOST:PORT [--nsqd-http HOST:PORT]
       [--count N] [--only SCENARIO ...] [--clients smartnsq raw] [--loop uvloop|asyncio]
Needs valgrind on the PATH. Under valgrind a client runs ~50x slower: the default N (5,000;
PUB one-at-a-time 2,000) keeps a run to a few minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import STOCK, delete_topic, preload

HERE = os.path.dirname(os.path.abspath(__file__))
_COLLECTED = re.compile(r"Collected : (\d+)")
#: messages of a scenario's first run, relative to --count
FACTOR = {"pub_sequential": 0.4, "pub_inflight": 1.0, "pub_autobatch": 2.0, "mpub": 5.0,
          "consume_fin": 1.0}


def instructions(client: str, scenario: str, nsqd: str, http: str | None, n: int,
                 loop: str) -> int:
    """Instructions of one peer run of ``n`` messages under callgrind."""
    topic = f"ti_{scenario}_{client}_{os.getpid()}_{n}"
    if scenario == "consume_fin":
        preload(nsqd, topic, n)
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           sys.executable, os.path.join(HERE, f"peer_{client}.py"), scenario,
           "--nsqd", nsqd, "--topic", topic, "--count", str(n), "--loop", loop]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    finally:
        delete_topic(http, topic)
    found = _COLLECTED.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{client} {scenario} failed under valgrind: "
                           f"{done.stderr.strip()[-400:]}")
    return int(found[-1])


def per_message(client: str, scenario: str, nsqd: str, http: str | None, n: int,
                loop: str) -> float:
    small = instructions(client, scenario, nsqd, http, n, loop)
    large = instructions(client, scenario, nsqd, http, 2 * n, loop)
    return (large - small) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nsqd", required=True, help="HOST:PORT of a stock nsqd's TCP port")
    ap.add_argument("--nsqd-http", help="its HTTP port, to delete the topics made")
    ap.add_argument("--count", type=int, default=5_000,
                    help="messages of the first run before the scenario's factor")
    ap.add_argument("--only", nargs="+", choices=[s.key for s in STOCK],
                    default=[s.key for s in STOCK])
    ap.add_argument("--clients", nargs="+", choices=["smartnsq", "raw"],
                    default=["smartnsq", "raw"])
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on the PATH (apt-get install valgrind)")
    print(f"instructions per message (callgrind; runs of N and 2N, difference / N), "
          f"{a.loop} loop, nsqd {a.nsqd}")
    print(f"{'scenario':<18} {'N':>7} " + " ".join(f"{c:>10}" for c in a.clients)
          + ("    ratio" if len(a.clients) == 2 else ""))
    t0 = time.monotonic()
    for sc in STOCK:
        if sc.key not in a.only:
            continue
        n = max(100, int(a.count * FACTOR[sc.key]) // 100 * 100)
        row = {c: per_message(c, sc.key, a.nsqd, a.nsqd_http, n, a.loop) for c in a.clients
               if c in sc.clients}
        cells = " ".join(f"{row[c]:>10,.0f}" if c in row else f"{'—':>10}" for c in a.clients)
        ratio = (f"  {row['smartnsq'] / row['raw']:>6.2f}×"
                 if "smartnsq" in row and "raw" in row else "")
        print(f"{sc.key:<18} {n:>7,} {cells}{ratio}", flush=True)
    print(f"total {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
