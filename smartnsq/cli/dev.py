"""``smartnsq dev``: the embedded cluster (argparse, unchanged since before the click CLI so
scripts and tests that drive it keep working).

``smartnsq dev`` runs an embedded NSQ cluster (:class:`~smartnsq.devcluster.DevCluster`) until
interrupted and prints its addresses, one ``<kind> <host:port>`` per line, then ``ready``::

    lookupd_http 127.0.0.1:40721
    nsqd_tcp 127.0.0.1:39125
    nsqd_http 127.0.0.1:44519
    ready
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from smartnsq.errors import NSQError


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    replica: int = 1


def _topic_spec(text: str) -> TopicSpec:
    parts = text.split(":")
    if len(parts) > 3 or not parts[0]:
        raise argparse.ArgumentTypeError(f"expected NAME[:PARTITIONS[:REPLICA]], got {text!r}")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"partitions and replica must be integers in {text!r}"
        ) from None
    if any(n < 1 for n in numbers):
        raise argparse.ArgumentTypeError(f"partitions and replica must be >= 1 in {text!r}")
    return TopicSpec(parts[0], *numbers)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smartnsq", description="smartnsq tools")
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser(
        "dev",
        help="run an embedded NSQ cluster until interrupted",
        description="Run an in-process nsqlookupd + nsqd cluster on 127.0.0.1 and print its "
        "addresses (one '<kind> <host:port>' per line, then 'ready').",
    )
    add_dev_arguments(dev)
    return parser


def add_dev_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=_positive, default=3, help="nsqd nodes (default 3)")
    parser.add_argument("--lookupds", type=_positive, default=1, help="nsqlookupds (default 1)")
    parser.add_argument("--flavour", choices=("youzan", "stock"), default="youzan")
    parser.add_argument(
        "--topic",
        type=_topic_spec,
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS[:REPLICA]]",
        help="create a topic at start (repeatable; partitions/replica are youzan only)",
    )
    parser.add_argument(
        "--channel",
        action="append",
        default=[],
        metavar="NAME",
        help="create this channel on every --topic, so it is writable at once (repeatable)",
    )
    parser.add_argument(
        "--lookupd-port", type=_positive, default=0, help="port of the first lookupd (default any)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")


async def run_dev(
    args: argparse.Namespace, *, out: TextIO | None = None, stop: asyncio.Event | None = None
) -> int:
    """Run the cluster until ``stop`` is set, or SIGINT/SIGTERM when ``stop`` is None."""
    from smartnsq.devcluster import DevCluster

    out = out if out is not None else sys.stdout
    stop = stop if stop is not None else _signal_event()
    cluster = DevCluster(
        nodes=args.nodes,
        lookupds=max(1, args.lookupds),
        flavour=args.flavour,
        lookupd_ports=[args.lookupd_port] if args.lookupd_port else (),
        host=args.host,
    )
    async with cluster:
        for spec in args.topic:
            cluster.create_topic(
                spec.name, spec.partitions, spec.replica, channels=tuple(args.channel)
            )
        lines = [f"flavour {cluster.flavour}"]
        lines += [f"lookupd_http {a}" for a in cluster.lookupd_http_addresses]
        for node in cluster.nodes:
            lines += [f"nsqd_tcp {node.tcp_address}", f"nsqd_http {node.http_address}"]
        lines += [f"topic {spec.name}" for spec in args.topic]
        lines.append("ready")
        print("\n".join(lines), file=out, flush=True)
        await stop.wait()
    return 0


def _signal_event() -> asyncio.Event:
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # not available on every platform (Windows); Ctrl-C then ends the loop instead
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, event.set)
    return event


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``smartnsq dev`` with ``argv`` (which starts with ``dev``)."""
    args = build_parser().parse_args(argv)
    if args.command == "dev":
        try:
            return asyncio.run(run_dev(args))
        except KeyboardInterrupt:
            return 130
        except (NSQError, OSError) as e:
            print(f"smartnsq dev: {e}", file=sys.stderr)
            return 1
    return 2  # pragma: no cover - argparse rejects unknown commands
