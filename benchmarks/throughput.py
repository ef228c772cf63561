"""Side-by-side throughput: smartnsq, pynsq and gnsq against the same nsqd, 100-byte bodies,
with a raw asyncio loop on the same wire as the ceiling row.

For every scenario (PUB one-at-a-time, PUB with many in flight, auto-batched publish, MPUB
x100 pipelined, consume + FIN with max_in_flight 2500) each client runs in its own process
(peer_smartnsq.py, peer_pynsq.py, peer_gnsq.py, peer_raw.py for the raw loop) on a fresh
topic, so its process CPU time is its own and asyncio, tornado and gevent never share a
process. Printed per client: messages/s,
client CPU µs per message (process CPU time ÷ messages), the rate one core of client CPU would
allow (10⁶ ÷ µs/msg: the figure that counts when the server is the bottleneck) and ratios to
pynsq. Before a consume run the client's topic gets a channel and N messages (MPUB preload);
after each run the topic is deleted over nsqd's HTTP API when its address is known, so every
run meets the same, empty server.

Then the youzan section (smartnsq only: the peers have no partition support): sharded
ordered publish, traced publish, partitioned and ordered consume with 1, 4 and 16
partitions, each on a fresh embedded youzan cluster (or ``--lookupd``).

``--metrics off prometheus otel`` runs smartnsq's rows once per mode (``off``: the default,
no metrics; ``prometheus``: the Prometheus adapter; ``otel``: the OpenTelemetry SDK's metrics
and traces, see peer_smartnsq.py) and prints the overhead table: client CPU per message per
mode, its change against ``off`` and its ratio to the raw loop.

``--baseline REV`` runs the smartnsq of git revision REV too (``smartnsq@<hash>`` rows, see
baseline.py) right after the working tree's in every scenario, and prints the working tree's
µs/msg against it: before and after a change in the same run.

By default the embedded stock cluster runs in a subprocess (``python -m smartnsq.devcluster``);
``benchmarks/devcluster.py`` runs once first and its figures are printed as the server
ceiling: the rate the embedded double reaches with a minimal raw client.

Usage: python benchmarks/throughput.py [--nsqd HOST:PORT [--nsqd-http HOST:PORT]]
       [--lookupd HOST:PORT] [--count N] [--scale F] [--only NAME ...]
       [--clients smartnsq pynsq gnsq raw] [--skip-youzan] [--loop uvloop|asyncio]
       [--metrics off prometheus otel] [--repeat N] [--baseline REV ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import consumer_bench
from _harness import BODY, Result, embedded_cluster, run_peer
from baseline import Baseline, baseline
from peer_smartnsq import METRICS, loop_name

#: "raw" is the ceiling row: a raw asyncio loop on the same wire (peer_raw.py), no client
CLIENTS = ("smartnsq", "pynsq", "gnsq", "raw")
PEER_SCRIPT = {c: f"peer_{c}.py" for c in CLIENTS}


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    factor: float  # messages = --count × factor × --scale
    clients: tuple[str, ...]
    ceiling: str | None  # the devcluster.py figure that bounds it (stock flavour)
    note: str = ""


STOCK = [
    Scenario("pub_sequential", "PUB one-at-a-time", 0.1, CLIENTS, None,
             "each publish awaits its OK before the next: round-trip bound"),
    Scenario("pub_inflight", "PUB many in flight", 1.0, CLIENTS, "PUB (pipelined)",
             "smartnsq: 1000 concurrent callers on one Producer; pynsq/gnsq: all N issued "
             "at once"),
    Scenario("pub_autobatch", "auto-batched publish", 2.0, ("smartnsq", "raw"), "MPUB x100",
             "smartnsq (5000 concurrent publish() callers, linger 1 ms, max_batch 500) and the "
             "raw loop with the same callers (a future each); ratios against pynsq's PUB many "
             "in flight, what a pynsq user would do"),
    Scenario("mpub", "MPUB x100 pipelined", 5.0, CLIENTS, "MPUB x100",
             "smartnsq: 50 MPUBs in flight; pynsq/gnsq: all N/100 issued at once"),
    Scenario("consume_fin", "consume + FIN", 1.0, CLIENTS, "consume + FIN (RDY 2500)",
             "max_in_flight 2500, one connection; clock from the first message (peers) or "
             "from unpausing (smartnsq) to the last message handled"),
]

#: scenarios whose raw loop also runs as "raw awaited" (peer_raw.py's scenario of that name):
#: the raw row writes each next PUB from the read that brought the OK (or, auto-batched,
#: callers await a bare future), which an API whose publish is an ``async def`` cannot do
AWAITED = {"pub_sequential": "pub_sequential_awaited", "pub_inflight": "pub_inflight_awaited",
           "pub_autobatch": "pub_autobatch_awaited", "consume_fin": "consume_fin_awaited"}

#: issue 20's targets: smartnsq's client CPU per message ÷ the raw loop's, same run
RAW_RATIO_TARGETS = {"consume_fin": 1.4, "pub_inflight": 1.0, "mpub": 2.5,
                     "pub_autobatch": 1.5, "pub_sequential": 1.5}

# (name, label, server-ceiling key in the youzan flavour)
YOUZAN: list[tuple[str, str, str | None]] = [
    ("ordered", "sharded ordered publish (100 keys, 1 caller/key)", "PUB (pipelined)"),
    ("ordered_batched", "sharded ordered publish (100 keys, 20 callers/key, linger 1 ms)",
     "MPUB x100"),
    ("traced", "traced publish (PUB_TRACE, 1000 in flight)", "PUB (pipelined)"),
    *[(f"partitioned_{p}", f"partitioned consume + FIN, {p} partition{'s' * (p > 1)}",
       "consume + FIN (RDY 2500)") for p in (1, 4, 16)],
    *[(f"ordered_{p}", f"ordered consume (SUB_ORDERED), {p} partition{'s' * (p > 1)}", None)
      for p in (1, 4, 16)],
]
#: the youzan scenarios run at their scripts' default counts times this (times --scale)
YOUZAN_SCALE = 0.25

#: issue 12's targets for smartnsq, client CPU per message (the figure that does not depend
#: on the server): scenario -> (max µs/msg, min rate relative to gnsq or None, µs/msg below
#: every peer's)
TARGETS: dict[str, tuple[float, float | None, bool]] = {
    "consume_fin": (2.0, None, False),
    "pub_inflight": (6.0, 1.5, False),
    "pub_autobatch": (1.5, None, False),
    "mpub": (0.5, None, True),
}


# ---------------------------------------------------------------------- server side

def server_ceiling(messages: int = 50_000) -> dict[str, dict[str, float]]:
    """Run benchmarks/devcluster.py (embedded double + raw asyncio client, one process) and
    return its figures by flavour and name."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run([sys.executable, os.path.join(here, "devcluster.py"),
                              "--messages", str(messages)],
                             capture_output=True, text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        print("  ! devcluster.py did not finish within 180 s", file=sys.stderr)
        return {}
    figures: dict[str, dict[str, float]] = {}
    for line in out.stdout.splitlines():
        m = re.match(r"^(\w+)\s+(.+?)\s+([\d,]+) msg/s$", line.strip())
        if m:
            figures.setdefault(m[1], {})[m[2]] = float(m[3].replace(",", ""))
    if not figures:
        print(f"  ! devcluster.py printed no figures: {out.stderr.strip()[-200:]}",
              file=sys.stderr)
    return figures


def delete_topic(http: str | None, topic: str) -> None:
    """Delete ``topic`` through nsqd's HTTP API, so the next run meets an empty server."""
    if http is None:
        return
    url = f"http://{http}/topic/delete?" + urllib.parse.urlencode({"topic": topic})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10):
            pass
    except OSError as e:
        print(f"  ! could not delete topic {topic}: {e}", file=sys.stderr)


def preload(nsqd: str, topic: str, count: int) -> None:
    """Create the channel ``bench`` on ``topic`` and put ``count`` messages in it."""
    async def run() -> None:
        async with asyncio.timeout(120):
            await consumer_bench.preload_channel(nsqd, topic, count)

    asyncio.run(run())


# ---------------------------------------------------------------------- running

def peer_timeout(n: int) -> float:
    return 60 + n / 2_000  # generous: the slowest peer scenario runs at ~5k msg/s


def run_stock(args: argparse.Namespace, nsqd: str, http: str | None,
              scenarios: list[Scenario], clients: tuple[str, ...],
              baselines: list[Baseline]) -> dict[str, list[Result]]:
    run_id = f"{os.getpid() % 100_000}"
    results: dict[str, list[Result]] = {}
    for sc in scenarios:
        n = max(100, int(args.count * sc.factor * args.scale) // 100 * 100)
        runs: list[tuple[str, str, Baseline | None]] = []
        for client in clients:
            if client in sc.clients:
                runs += [(client, mode, None)
                         for mode in (args.metrics if client == "smartnsq" else ["off"])]
                if client == "smartnsq":
                    runs += [(client, "off", b) for b in baselines]
        for client, mode, base in runs:
            topic = f"tp_{sc.key}_{client}_{mode}_{run_id}"
            if sc.key == "consume_fin":
                preload(nsqd, topic, n)
            extra = ["--loop", args.loop] if client in ("smartnsq", "raw") else []
            if client == "smartnsq":
                extra += ["--metrics", mode]
            t0 = time.monotonic()
            got = run_peer(PEER_SCRIPT[client], sc.key, "--nsqd", nsqd, "--topic", topic,
                           "--count", str(n), *extra, timeout=peer_timeout(n),
                           env=None if base is None else base.env())
            if base is not None:
                for r in got:
                    r.client = base.label
            if client == "raw" and sc.key in AWAITED:
                # the floor of an awaited publish (or handler), beside the raw loop's
                if sc.key == "consume_fin":
                    preload(nsqd, topic, n)
                got += run_peer(PEER_SCRIPT[client], AWAITED[sc.key], "--nsqd", nsqd,
                                "--topic", topic, "--count", str(n), *extra,
                                timeout=peer_timeout(n))
            delete_topic(http, topic)
            for r in got:
                r.scenario = sc.key
                results.setdefault(sc.key, []).append(r)
                print(f"  {sc.label:<24} {r.client:<19} {r.rate:>11,.0f} msg/s "
                      f"{r.cpu_us_per_msg:>8.2f} µs/msg  ({r.messages:,} msgs, "
                      f"{time.monotonic() - t0:.1f} s with start-up)", flush=True)
    return results


def median_rows(runs: list[dict[str, list[Result]]]) -> dict[str, list[Result]]:
    """Each (scenario, client) row's run with the median µs/msg (the upper one of an even
    count), in the first run's order."""
    merged: dict[str, list[Result]] = {}
    for key, rows in runs[0].items():
        for row in rows:
            same = sorted((r for run in runs for r in run.get(key, [])
                           if r.client == row.client), key=lambda r: r.cpu_us_per_msg)
            merged.setdefault(key, []).append(same[len(same) // 2])
    return merged


def run_youzan(args: argparse.Namespace, names: list[str]) -> dict[str, Result]:
    """Results by scenario name (suffixed ``+mode`` for the metrics modes but ``off``)."""
    results: dict[str, Result] = {}
    for name in names:
        for mode in args.metrics:
            extra = ["--lookupd", args.lookupd] if args.lookupd else []
            got = run_peer("peer_smartnsq.py", name, "--scale",
                           str(YOUZAN_SCALE * args.scale), "--loop", args.loop,
                           "--metrics", mode, *extra, timeout=300)
            for r in got:
                results[name if mode == "off" else f"{name}+{mode}"] = r
                print(f"  {name:<24} {r.client:<19} {r.rate:>11,.0f} msg/s "
                      f"{r.cpu_us_per_msg:>8.2f} µs/msg  ({r.messages:,} msgs)", flush=True)
    return results


# ---------------------------------------------------------------------- printing

def _ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}×" if x and y else "—"


def _k(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def print_stock_table(results: dict[str, list[Result]], scenarios: list[Scenario],
                      ceiling: dict[str, float] | None) -> None:
    head = (f"{'scenario':<24} {'client':<19} {'msgs':>9} {'msg/s':>11} {'µs/msg':>8} "
            f"{'sys':>5} {'1-core cap':>11} {'msg/s ×pynsq':>12} {'CPU ×pynsq':>10}")
    print(head)
    print("-" * len(head))
    marks: list[str] = []
    for sc in scenarios:
        rows = results.get(sc.key, [])
        if not rows:
            continue
        base_key = "pub_inflight" if sc.key == "pub_autobatch" else sc.key
        base = next((r for r in results.get(base_key, []) if r.client == "pynsq"), None)
        cap = ceiling.get(sc.ceiling) if ceiling and sc.ceiling else None
        label = sc.label
        for r in rows:
            bound = cap is not None and r.rate >= 0.8 * cap
            rate = f"{r.rate:,.0f}{'*' if bound else ' '}"
            sys_us = r.sys / r.messages * 1e6 if r.messages else 0.0
            print(f"{label:<24} {r.client:<19} {r.messages:>9,} {rate:>11} "
                  f"{r.cpu_us_per_msg:>8.2f} {sys_us:>5.2f} "
                  f"{1e6 / r.cpu_us_per_msg if r.cpu else 0:>11,.0f} "
                  f"{_ratio(r.rate, base.rate) if base else '—':>12} "
                  f"{_ratio(base.cpu_us_per_msg, r.cpu_us_per_msg) if base else '—':>10}")
            label = ""
        marks.append(f"  {sc.label}: {sc.note}")
    print("-" * len(head))
    print("raw = a raw asyncio loop on the same wire and event loop (benchmarks/peer_raw.py: "
          "struct parsing, one write per read, no client library): the ceiling; the distance "
          "to it is the client's own cost.")
    print("raw awaited = the raw loop with callers awaiting an async def publish around a "
          "future per PUB (the raw row writes the next PUB from the read that brought an OK; "
          "auto-batched, its callers await the bare future), or, for consume, handing each "
          "message to an async handler it awaits: the floor of an asyncio publish or handler.")
    print("sys = the kernel's share of µs/msg (socket reads and writes; on loopback a write "
          "also delivers to nsqd).")
    print("msg/s ×pynsq = rate ÷ pynsq's rate; CPU ×pynsq = pynsq's µs/msg ÷ this client's "
          "µs/msg (both: higher is better).\n1-core cap = 10⁶ ÷ µs/msg, the rate the client's "
          "CPU cost would allow on one core if the server kept up.")
    if ceiling:
        print("* at ≥ 80 % of the embedded double's ceiling: the server is the bottleneck, "
              "compare µs/msg and 1-core cap.")
    print("\n".join(marks))


def print_overhead(results: dict[str, list[Result]], scenarios: list[Scenario],
                   modes: list[str]) -> None:
    """smartnsq's client CPU per message per metrics mode, against ``off`` and the raw loop
    (the issue's target: off within noise of today, prometheus ≤ +15 % on consume + FIN)."""
    head = (f"{'scenario':<24} {'metrics':<11} {'µs/msg':>8} {'vs off':>8} {'×raw':>6}")
    print(head)
    print("-" * len(head))
    for sc in scenarios:
        rows = {r.client: r for r in results.get(sc.key, [])}
        off, raw = rows.get("smartnsq"), rows.get("raw")
        label = sc.label
        for mode in modes:
            r = rows.get("smartnsq" if mode == "off" else f"smartnsq+{mode}")
            if r is None:
                continue
            vs = (f"{(r.cpu_us_per_msg / off.cpu_us_per_msg - 1) * 100:+.1f}%"
                  if off and off.cpu_us_per_msg else "—")
            x_raw = _ratio(r.cpu_us_per_msg, raw.cpu_us_per_msg) if raw else "—"
            print(f"{label:<24} {mode:<11} {r.cpu_us_per_msg:>8.2f} {vs:>8} {x_raw:>6}")
            label = ""
    print("-" * len(head))
    print("×raw = smartnsq's µs/msg ÷ the raw loop's (lower is better); vs off = the change "
          "against smartnsq with metrics off in this run.")


def print_targets(results: dict[str, list[Result]], scenarios: list[Scenario]) -> None:
    by_key = {sc.key: sc for sc in scenarios}
    lines = []
    for key, (max_us, vs_gnsq, below_peers) in TARGETS.items():
        rows = {r.client: r for r in results.get(key, [])}
        r = rows.get("smartnsq")
        if r is None or key not in by_key:
            continue
        checks = [f"≤ {max_us:g} µs/msg: {r.cpu_us_per_msg:.2f} "
                  f"({'met' if r.cpu_us_per_msg <= max_us else 'not met'})"]
        gnsq = rows.get("gnsq")
        if vs_gnsq is not None and gnsq is not None and gnsq.rate:
            ratio = r.rate / gnsq.rate
            checks.append(f"≥ {vs_gnsq:g}× gnsq's rate: {ratio:.2f}× "
                          f"({'met' if ratio >= vs_gnsq else 'not met'})")
        peers = [p for c, p in rows.items() if c in ("pynsq", "gnsq")]
        if below_peers and peers:
            best = min(p.cpu_us_per_msg for p in peers)
            checks.append(f"below every peer: best peer {best:.2f} "
                          f"({'met' if r.cpu_us_per_msg < best else 'not met'})")
        lines.append(f"  {by_key[key].label}: " + "; ".join(checks))
    if lines:
        print("issue 12 targets (smartnsq, client CPU per message):")
        print("\n".join(lines))
    lines = []
    for key, most in RAW_RATIO_TARGETS.items():
        rows = {r.client: r for r in results.get(key, [])}
        r, raw = rows.get("smartnsq"), rows.get("raw")
        if r is None or raw is None or key not in by_key or not raw.cpu_us_per_msg:
            continue
        x = r.cpu_us_per_msg / raw.cpu_us_per_msg
        met = "met" if x <= most else "not met"
        line = f"  {by_key[key].label}: ≤ {most:g}× raw: {x:.2f}× ({met})"
        awaited = rows.get("raw awaited")
        if awaited is not None and awaited.cpu_us_per_msg:
            line += f"; {r.cpu_us_per_msg / awaited.cpu_us_per_msg:.2f}× raw awaited"
        lines.append(line)
    if lines:
        print("issue 20 targets (smartnsq's µs/msg ÷ the raw loop's, this run):")
        print("\n".join(lines))


def print_baselines(results: dict[str, list[Result]], scenarios: list[Scenario],
                    baselines: list[Baseline]) -> None:
    """The working tree's µs/msg against each baseline revision's, scenario by scenario."""
    for base in baselines:
        lines = []
        for sc in scenarios:
            rows = {r.client: r for r in results.get(sc.key, [])}
            now, then = rows.get("smartnsq"), rows.get(base.label)
            if now is None or then is None or not then.cpu_us_per_msg:
                continue
            x = now.cpu_us_per_msg / then.cpu_us_per_msg
            lines.append(f"  {sc.label}: {then.cpu_us_per_msg:.2f} → {now.cpu_us_per_msg:.2f} "
                         f"µs/msg ({x:.2f}×, {'less' if x < 1 else 'more'} CPU per message)")
        if lines:
            print(f"smartnsq (working tree) against {base.label}, this run:")
            print("\n".join(lines))


def print_youzan_table(results: dict[str, Result], ceiling: dict[str, float] | None) -> None:
    head = (f"{'scenario':<66} {'msgs':>9} {'msg/s':>11} {'µs/msg':>8} {'1-core cap':>11}")
    print(head)
    print("-" * len(head))
    for name, label, ceil_key in YOUZAN:
        for key in [k for k in results if k == name or k.startswith(f"{name}+")]:
            r = results[key]
            cap = ceiling.get(ceil_key) if ceiling and ceil_key else None
            rate = f"{r.rate:,.0f}{'*' if cap and r.rate >= 0.8 * cap else ' '}"
            mode = key.partition("+")[2]
            print(f"{label + (f' [{mode}]' if mode else ''):<66} {r.messages:>9,} {rate:>11} "
                  f"{r.cpu_us_per_msg:>8.2f} {1e6 / r.cpu_us_per_msg if r.cpu else 0:>11,.0f}")
    print("-" * len(head))
    print("ordered consume holds one message in flight per partition (SUB_ORDERED), so it "
          "measures round trips, not CPU.")


def main(argv: list[str] | None = None) -> int:
    stock_names = [sc.key for sc in STOCK]
    youzan_names = [y[0] for y in YOUZAN]
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--nsqd", help="HOST:PORT of a stock nsqd's TCP port (default: embedded)")
    ap.add_argument("--nsqd-http", help="its HTTP port, to delete the benchmark's topics")
    ap.add_argument("--lookupd", help="HOST:PORT of a youzan lookupd's HTTP port for the "
                    "youzan section (default: a fresh embedded cluster per scenario)")
    ap.add_argument("--count", type=int, default=100_000,
                    help="messages per stock row before the row's factor "
                    "(PUB one-at-a-time ×0.1, auto-batched ×2, MPUB ×5; default 100000)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every message count")
    ap.add_argument("--only", nargs="+", default=[], choices=stock_names + youzan_names,
                    metavar="NAME", help=f"run only these: {' '.join(stock_names)} "
                    f"{' '.join(youzan_names)}")
    ap.add_argument("--clients", nargs="+", default=list(CLIENTS), metavar="CLIENT",
                    help="smartnsq pynsq gnsq (space or comma separated)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run the stock rows N times (interleaved) and report each row's "
                    "median µs/msg run (default 1)")
    ap.add_argument("--skip-youzan", action="store_true", help="skip the youzan section")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="smartnsq's event loop (default uvloop when installed)")
    ap.add_argument("--metrics", nargs="+", default=["off"], choices=METRICS,
                    help="smartnsq's metrics, one run per mode: off (default), prometheus, "
                    "otel (the OpenTelemetry SDK's metrics and traces)")
    ap.add_argument("--baseline", nargs="+", default=[], metavar="REV",
                    help="also run the smartnsq of these git revisions (stock rows, metrics "
                    "off; the revision must have today's public API) and compare")
    args = ap.parse_args(argv)
    clients = tuple(c for c in CLIENTS
                    if c in {x for arg in args.clients for x in arg.split(",") if x})
    unknown = {x for arg in args.clients for x in arg.split(",") if x} - set(CLIENTS)
    if unknown or not clients:
        ap.error(f"--clients: choose from {', '.join(CLIENTS)}")
    scenarios = [sc for sc in STOCK if not args.only or sc.key in args.only]
    youzan = [] if args.skip_youzan else [
        n for n in youzan_names if not args.only or n in args.only]

    loop = loop_name(args.loop)
    server = f"nsqd {args.nsqd}" if args.nsqd else "embedded stock nsqd (subprocess)"
    print(f"smartnsq throughput benchmark, side by side: {', '.join(clients)}; "
          f"{len(BODY)}-byte bodies; server: {server}; smartnsq loop: {loop}; "
          f"cpus: {os.cpu_count()}; load average {os.getloadavg()[0]:.2f}; "
          f"python {sys.version.split()[0]}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    if args.nsqd and not args.nsqd_http:
        print("(no --nsqd-http: the benchmark's topics are left on the server)", flush=True)
    started = time.monotonic()

    ceiling: dict[str, dict[str, float]] = {}
    if not args.nsqd or (youzan and not args.lookupd):
        ceiling = server_ceiling()
        for flavour, figs in ceiling.items():
            print(f"server ceiling (embedded {flavour} double, raw asyncio client in its "
                  f"process): " + ", ".join(f"{k} {v:,.0f}" for k, v in figs.items())
                  + " msg/s", flush=True)

    stock_results: dict[str, list[Result]] = {}
    baselines: list[Baseline] = []
    if scenarios:
        with contextlib.ExitStack() as stack:
            if "smartnsq" in clients:
                baselines = [stack.enter_context(baseline(rev)) for rev in args.baseline]
            if args.nsqd:
                nsqd, http = args.nsqd, args.nsqd_http
            else:
                addrs = stack.enter_context(embedded_cluster("stock", 1))
                nsqd, http = addrs["nsqd_tcp"][0], addrs["nsqd_http"][0]
            runs = [run_stock(args, nsqd, http, scenarios, clients, baselines)
                    for _ in range(max(1, args.repeat))]
            stock_results = median_rows(runs)

    youzan_results: dict[str, Result] = {}
    if youzan and "smartnsq" in clients:
        print("youzan (smartnsq only):", flush=True)
        youzan_results = run_youzan(args, youzan)

    stock_ceiling = None if args.nsqd else ceiling.get("stock")
    youzan_ceiling = None if args.lookupd else ceiling.get("youzan")
    print()
    if stock_results:
        print(f"== stock nsqd: {server}, {len(BODY)}-byte bodies ==")
        print_stock_table(stock_results, scenarios, stock_ceiling)
        print()
        if args.metrics != ["off"] and "smartnsq" in clients:
            print_overhead(stock_results, scenarios, args.metrics)
            print()
        print_targets(stock_results, scenarios)
        print()
        if baselines:
            print_baselines(stock_results, scenarios, baselines)
            print()
    if youzan_results:
        where = f"lookupd {args.lookupd}" if args.lookupd else "embedded youzan cluster"
        print(f"== youzan (smartnsq only; the peers have no partition support): {where} ==")
        print_youzan_table(youzan_results, youzan_ceiling)
        print()
    if ceiling:
        for flavour, figs in ceiling.items():
            print(f"server ceiling, embedded {flavour} double: "
                  + ", ".join(f"{k} {_k(v)}" for k, v in figs.items()) + " msg/s")
    print(f"total {time.monotonic() - started:.0f} s; load average now "
          f"{os.getloadavg()[0]:.2f} (other processes on this machine skew msg/s more than "
          "µs/msg)")
    modes = len(args.metrics)
    expected = sum((modes + len(baselines) if c == "smartnsq" else
                    2 if c == "raw" and sc.key in AWAITED else 1)
                   for sc in scenarios for c in clients if c in sc.clients)
    got = sum(len(v) for v in stock_results.values()) + len(youzan_results)
    if "smartnsq" in clients:
        expected += len(youzan) * modes
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
