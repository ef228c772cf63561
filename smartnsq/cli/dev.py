"""``smartnsq dev``: run the embedded NSQ cluster (:class:`~smartnsq.devcluster.DevCluster`)
until interrupted, printing its addresses, one ``<kind> <host:port>`` per line, then
``ready``::

    flavour youzan
    lookupd_http 127.0.0.1:40721
    nsqd_tcp 127.0.0.1:39125
    nsqd_http 127.0.0.1:44519
    topic demo
    ready

Topic shapes follow youzan's nsqlookupd: a topic that is not ordered keeps every replica of
every partition on its own nsqd (partitions × replicas nodes), an ordered one needs only as
many nodes as replicas. ``dev`` starts the nodes the ``--topic`` shapes need beyond
``--nodes`` (saying so on stderr), and refuses a shape no dev cluster can hold in one line
that says what to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

import click

from smartnsq.cli.common import (
    CliError,
    OutputClosed,
    describe,
    err_print,
    one_line,
    writing_stdout,
)
from smartnsq.cli.stopping import EXIT_INTERRUPTED
from smartnsq.errors import NSQError

EPILOG = """\b
Examples:
  smartnsq dev --flavour youzan --nodes 3 --topic demo:4
  smartnsq dev --topic orders:4:2 --ordered --channel billing
  smartnsq dev --flavour stock --nodes 1 --topic events --channel audit
  python -m smartnsq.devcluster --nodes 3 --topic demo:4      # the same as smartnsq dev
"""

#: youzan's nsqlookupd refuses partition_num >= 255 and more than 5 replicas
MAX_PARTITIONS = 254
MAX_REPLICAS = 5
#: nodes one dev process starts at most (each is an nsqd with two listening ports)
MAX_NODES = 16

TOPIC_SYNTAX = "NAME[:PARTITIONS[:REPLICA]]"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    replica: int = 1

    def __str__(self) -> str:
        if self.replica > 1:
            return f"{self.name}:{self.partitions}:{self.replica}"
        return f"{self.name}:{self.partitions}" if self.partitions > 1 else self.name

    def nodes(self, ordered: bool) -> int:
        """nsqd the topic needs (youzan's coordinator: replicas, times partitions unless
        several partitions may share a node)."""
        return self.replica if ordered else self.partitions * self.replica


def parse_topic_spec(text: str) -> TopicSpec:
    parts = text.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ValueError(f"expected {TOPIC_SYNTAX}, got {text!r}")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(f"partitions and replica must be integers in {text!r} "
                         f"({TOPIC_SYNTAX})") from None
    if any(n < 1 for n in numbers):
        raise ValueError(f"partitions and replica must be >= 1 in {text!r} ({TOPIC_SYNTAX})")
    from smartnsq.protocol.validation import check_topic

    try:
        check_topic(parts[0])
    except NSQError as exc:
        raise ValueError(one_line(str(exc))) from None
    return TopicSpec(parts[0], *numbers)


class TopicParam(click.ParamType[TopicSpec]):
    name = TOPIC_SYNTAX

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> TopicSpec:
        if isinstance(value, TopicSpec):
            return value
        try:
            return parse_topic_spec(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _channel(ctx: click.Context, param: click.Parameter,
             value: tuple[str, ...]) -> tuple[str, ...]:
    from smartnsq.protocol.validation import check_channel

    for v in value:
        try:
            check_channel(v)
        except NSQError as exc:
            raise click.BadParameter(one_line(str(exc)), ctx, param) from None
    return value


@dataclass(frozen=True)
class DevOptions:
    """What ``smartnsq dev`` runs (its options, parsed)."""

    nodes: int = 3
    lookupds: int = 1
    flavour: Literal["stock", "youzan"] = "youzan"
    topic: tuple[TopicSpec, ...] = ()
    channel: tuple[str, ...] = ()
    ordered: bool = False
    lookupd_port: int = 0
    host: str = "127.0.0.1"


def plan_nodes(opts: DevOptions) -> int:
    """The nsqd to start: ``opts.nodes``, or more when a topic's shape needs them; raises
    :class:`click.UsageError` (one line: what to change) for a shape no dev cluster holds."""
    if opts.flavour == "stock":
        if opts.ordered:
            raise click.UsageError("--ordered is youzan only: add --flavour youzan")
        for spec in opts.topic:
            if spec.partitions > 1 or spec.replica > 1:
                raise click.UsageError(
                    f"--topic {spec}: partitions and replicas are youzan only: give "
                    f"--topic {spec.name}, or add --flavour youzan")
        return opts.nodes
    needed = opts.nodes
    for spec in opts.topic:
        if spec.partitions > MAX_PARTITIONS:
            raise click.UsageError(f"--topic {spec}: youzan allows at most {MAX_PARTITIONS} "
                                   "partitions")
        if spec.replica > MAX_REPLICAS:
            raise click.UsageError(f"--topic {spec}: youzan allows at most {MAX_REPLICAS} "
                                   "replicas")
        n = spec.nodes(opts.ordered)
        if n > MAX_NODES:
            raise click.UsageError(
                f"--topic {spec} needs {n} nsqd ({spec.partitions} partitions x "
                f"{spec.replica} replicas, each on its own node unless the topic is ordered) "
                f"and dev starts at most {MAX_NODES}: use fewer partitions or replicas, or "
                "--ordered (partitions then share nodes)")
        needed = max(needed, n)
    return needed


@click.command("dev", epilog=EPILOG)
@click.option("--nodes", type=click.IntRange(min=0), default=3, show_default=True,
              help="nsqd nodes to start (more when a --topic needs them, said on stderr)")
@click.option("--lookupds", type=click.IntRange(min=1), default=1, show_default=True,
              help="nsqlookupd instances")
@click.option("--flavour", type=click.Choice(["youzan", "stock"]), default="youzan",
              show_default=True)
@click.option("--topic", type=TopicParam(), multiple=True, metavar=TOPIC_SYNTAX,
              help="create a topic at start (repeatable; partitions and replica are youzan "
                   "only; a topic that is not ordered needs PARTITIONS x REPLICA nodes)")
@click.option("--ordered", is_flag=True,
              help="youzan: make the --topic topics ordered (SUB_ORDERED only; their "
                   "partitions may share nodes)")
@click.option("--channel", multiple=True, metavar="NAME", callback=_channel,
              help="create this channel on every --topic, so it is writable at once "
                   "(repeatable)")
@click.option("--lookupd-port", type=click.IntRange(0, 65535), default=0,
              help="port of the first lookupd (default: any free port)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
def dev(**params: Any) -> int:
    """Run an in-process nsqlookupd + nsqd cluster until interrupted (Ctrl-C or SIGTERM) and
    print its addresses: one '<kind> <host:port>' per line, then 'ready'."""
    opts = DevOptions(**params)
    nodes = plan_nodes(opts)
    if nodes > opts.nodes:
        big = max(opts.topic, key=lambda s: s.nodes(opts.ordered))
        err_print(f"smartnsq dev: starting {nodes} nsqd, not {opts.nodes}: topic {big} has "
                  f"{big.partitions} partition(s) x {big.replica} replica(s), and a youzan "
                  "topic that is not ordered keeps each on its own node (--ordered topics "
                  "share nodes)")
        opts = dataclasses.replace(opts, nodes=nodes)
    elif nodes == 0:
        # legal (a lookupd alone), but a newcomer's cluster would take no message: say so
        err_print("smartnsq dev: --nodes 0 and no --topic: only the lookupd runs, no nsqd "
                  "takes messages (give --nodes N to start some)")
    try:
        return asyncio.run(run_dev(opts))
    except KeyboardInterrupt:  # before the signal handlers are in place
        err_print(INTERRUPTED)
        return EXIT_INTERRUPTED
    except (NSQError, OSError) as exc:
        raise CliError(start_error(opts, exc)) from exc


INTERRUPTED = "smartnsq dev: interrupted while starting, nothing left running"


def start_error(opts: DevOptions, exc: NSQError | OSError) -> str:
    """One line naming the option to change when the cluster cannot listen (errno text
    alone, "address already in use", does not say which flag chose that address)."""
    if isinstance(exc, socket.gaierror):
        return f"--host {opts.host}: cannot be resolved ({exc.strerror or exc})"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        if opts.lookupd_port:
            return (f"--lookupd-port {opts.lookupd_port}: {opts.host}:{opts.lookupd_port} is "
                    "already in use (another smartnsq dev, or an nsqlookupd?): pick another "
                    "port, or leave --lookupd-port out for a free one")
        return f"cannot listen on {opts.host}: {describe(exc)}"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        return (f"--host {opts.host}: not an address of this machine "
                f"({os.strerror(errno.EADDRNOTAVAIL).lower()}): "
                "use 127.0.0.1, or one of this machine's addresses")
    return describe(exc)


async def run_dev(args: DevOptions, *, out: TextIO | None = None,
                  stop: asyncio.Event | None = None) -> int:
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
        if stop.is_set():
            # Ctrl-C while the servers started: printing 'ready' then exiting at once would
            # tell a script waiting for 'ready' that a cluster is there
            print(INTERRUPTED, file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        for spec in args.topic:
            cluster.create_topic(spec.name, spec.partitions, spec.replica,
                                 ordered=args.ordered, channels=tuple(args.channel))
        lines = [f"flavour {cluster.flavour}"]
        lines += [f"lookupd_http {a}" for a in cluster.lookupd_http_addresses]
        for node in cluster.nodes:
            lines += [f"nsqd_tcp {node.tcp_address}", f"nsqd_http {node.http_address}"]
        lines += [f"topic {spec.name}" for spec in args.topic]
        lines.append("ready")
        try:
            # a reader gone before the addresses (| head on a closed pipe) ends quietly like
            # every command whose output was closed; another failure (a full disk) is the
            # commands' one error line, not "error: OSError"
            with writing_stdout("the addresses") if out is sys.stdout \
                    else contextlib.nullcontext():
                print("\n".join(lines), file=out, flush=True)
        except (BrokenPipeError, OutputClosed):
            return 0
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


class DevArgs:
    """``parse_args(["dev", ...])`` → :class:`DevOptions`, through the click command's own
    parser (for callers of the argparse interface ``dev`` had before it was a click
    command); a bad argument prints click's usage error and raises ``SystemExit(2)``."""

    def parse_args(self, argv: Sequence[str]) -> DevOptions:
        args = list(argv)
        if args[:1] == ["dev"]:
            args = args[1:]
        try:
            with dev.make_context("smartnsq dev", args) as ctx:
                return DevOptions(**ctx.params)
        except click.UsageError as exc:
            exc.show(file=sys.stderr)
            raise SystemExit(exc.exit_code) from None


def build_parser() -> DevArgs:
    return DevArgs()
