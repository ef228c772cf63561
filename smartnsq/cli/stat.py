"""``smartnsq stat [TOPIC]``: a live table of every topic partition and channel (like
``nsq_stat``, partition-aware), built from each nsqd's own ``/stats``.

Per partition (youzan) or per nsqd (stock): leader and replicas, messages stored, retained
bytes (youzan), topic depth (stock), publishing clients and the publish rate. Per channel:
depth (messages waiting) and its bytes (youzan ``depth_size``), in flight, deferred,
requeued, timed out, connected clients, the consume rate and the lag: every message not yet
finished (depth + in flight + deferred). Rates are the difference between two refreshes.

``--client-metrics URL`` (repeatable: the Prometheus endpoints of running smartnsq processes,
``--metrics-port`` or an application's exporter) adds the client side beside it: per channel,
what those clients received, finished, requeued and gave up, what they hold in flight and
their finish rate, next to the channel's depth and in flight on nsqd
(:mod:`smartnsq.cli.client_metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from smartnsq.cli.client_metrics import (
    ClientCounts,
    Key,
    check_installed,
    endpoint_url,
    endpoints_json,
)
from smartnsq.cli.common import (
    CliError,
    cluster_options,
    echo,
    pick_cluster,
    stdout_console,
    stdout_gone,
    topic_argument,
    unless_stopped,
    writing_stdout,
)
from smartnsq.cli.stat_sample import ClientSide, HungNodes, Sample, take_sample, tcp_addresses
from smartnsq.cli.stopping import command_runner, stop_event
from smartnsq.cli.wire import http_wire_options, nsqd_http_client
from smartnsq.protocol.validation import NO_PARTITION

# the HTTP client (aiohttp) loads when the command runs, not for its --help
if TYPE_CHECKING:
    from smartnsq.nsqd_http import NsqdHttpClient

EPILOG = """\b
Examples:
  smartnsq stat --lookupd 127.0.0.1:4161
  smartnsq stat orders --lookupd 127.0.0.1:4161 --interval 5
  smartnsq stat --nsqd 127.0.0.1:4151 --nsqd 127.0.0.1:4251 --once --json
  smartnsq stat orders --lookupd 127.0.0.1:4161 --client-metrics 127.0.0.1:9108
"""


def _int(doc: dict[str, Any], key: str) -> int:
    v = doc.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def natural(name: str) -> tuple[list[str | int], str]:
    """Sort key of a name with its runs of digits compared as numbers: t1, t2, t10, t100
    (as text t10 would come before t2); the name itself breaks ties (t01 and t1)."""
    parts: list[str | int] = [int(p) if i % 2 else p
                              for i, p in enumerate(_DIGITS.split(name))]
    return parts, name


_DIGITS = re.compile(r"([0-9]+)")


def _rate(now: int, before: int | None, dt: float | None) -> float | None:
    if before is None or dt is None or dt <= 0:
        return None
    return max(0, now - before) / dt


def build_doc(sample: Sample, previous: Sample | None) -> dict[str, Any]:
    """The table's content as JSON: ``nodes`` (every nsqd asked, with its error) and
    ``topics`` (one entry per topic partition, or per topic and nsqd on stock)."""
    dt = sample.at - previous.at if previous is not None else None
    before: dict[tuple[str, int, str], dict[str, Any]] = {}
    if previous is not None:
        for node, st in previous.stats.items():
            for t in st["topics"]:
                before[(t.get("topic_name", ""), _partition(t), node)] = t

    groups: dict[tuple[str, int, str], list[tuple[str, dict[str, Any]]]] = {}
    for node, st in sorted(sample.stats.items()):
        for t in st["topics"]:
            part = _partition(t)
            # youzan: one row per partition (leader + replicas); stock: one per nsqd
            key = (t.get("topic_name", ""), part, "" if part != NO_PARTITION else node)
            groups.setdefault(key, []).append((node, t))

    topics = []
    matched: set[Key] = set()
    # natural order of names (t2 before t10), then partitions by number, then nsqd
    for (name, part, _), entries in sorted(groups.items(),
                                           key=lambda g: (natural(g[0][0]), *g[0][1:])):
        leaders = [n for n, t in entries if t.get("is_leader", part == NO_PARTITION)]
        leader = leaders[0] if leaders else None
        node, t = next(((n, t) for n, t in entries if n == leader), entries[0])
        replicas = sorted(n for n, _ in entries if n != leader)
        prev_t = before.get((name, part, node))
        youzan = "topic_partition" in t
        prev_ch = {c.get("channel_name"): c for c in (prev_t or {}).get("channels") or []}
        channels = []
        for c in t.get("channels") or []:
            cname = c.get("channel_name", "")
            depth, in_flight, deferred = (_int(c, "depth"), _int(c, "in_flight_count"),
                                          _int(c, "deferred_count"))
            pc = prev_ch.get(cname)
            channels.append({
                "channel": cname,
                "depth": depth,
                "depth_bytes": _int(c, "depth_size") if youzan else None,
                "in_flight": in_flight,
                "deferred": deferred,
                "requeued": _int(c, "requeue_count"),
                "timed_out": _int(c, "timeout_count"),
                "message_count": _int(c, "message_count"),
                "clients": _int(c, "client_num" if youzan else "client_count"),
                "paused": bool(c.get("paused", False)),
                "lag": depth + in_flight + deferred,
                "rate": _rate(_int(c, "message_count"),
                              _int(pc, "message_count") if pc is not None else None, dt),
            })
            if sample.clients is not None:
                mine, keys = sample.client(name, cname, part, node)
                matched.update(keys)
                before_c = previous.client(name, cname, part, node)[0] if previous else None
                channels[-1]["client"] = _client_json(mine, before_c, dt)
        topics.append({
            "topic": name,
            "partition": part if youzan else None,
            "leader": leader,
            "replicas": replicas,
            "message_count": _int(t, "message_count"),
            "depth": None if youzan else _int(t, "depth"),
            "bytes": (_int(t, "backend_depth") - _int(t, "backend_start")) if youzan
            else _int(t, "message_bytes"),
            "clients": _int(t, "client_num") if youzan else None,
            "paused": bool(t.get("paused", False)),
            "rate": _rate(_int(t, "message_count"),
                          _int(prev_t, "message_count") if prev_t is not None else None, dt),
            "channels": channels,
        })
    nodes = [{"http_address": n, "version": sample.stats[n].get("version"), "error": None}
             for n in sorted(sample.stats)]
    nodes += [{"http_address": n, "version": None, "error": e}
              for n, e in sorted(sample.errors.items())]
    doc = {"at": sample.at, "nodes": nodes, "topics": topics}
    if sample.clients is not None:
        doc["client_metrics"] = endpoints_json(sample.endpoints, sample.client_errors)
        # what the clients report that no row of the server side matched (a channel gone
        # from nsqd, an nsqd not asked): shown, not dropped
        doc["unmatched_clients"] = [
            {"topic": k[0], "channel": k[1], "partition": k[2], "nsqd": k[3],
             **sample.clients[k].as_json()}
            for k in sorted(sample.clients, key=_client_order) if k not in matched]
    return doc


def _client_order(k: Key) -> tuple[object, ...]:
    """Clients' rows in the server side's order: names naturally, partitions by number."""
    return natural(k[0]), natural(k[1]), natural(k[2]), k[3]


def _client_json(now: ClientCounts | None, before: ClientCounts | None,
                 dt: float | None) -> dict[str, Any] | None:
    if now is None:
        return None
    return {**now.as_json(),
            "rate": _rate(int(now.finished), int(before.finished) if before else None, dt)}


def _partition(t: dict[str, Any]) -> int:
    p = t.get("topic_partition")
    try:
        return int(p) if p not in (None, "") else NO_PARTITION
    except (TypeError, ValueError):
        return NO_PARTITION


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


#: lines of the table that are not rows (title, header, borders) and a line for the prompt
TABLE_CHROME = 6


def render(doc: dict[str, Any], height: int | None = None) -> Group:
    """The table; given the screen's ``height`` (a live table, which shows only what fits),
    its title says how many rows fell below the screen and how to see them."""
    title = time.strftime("smartnsq stat %H:%M:%S", time.localtime(doc["at"]))
    rows = sum(max(1, len(t["channels"])) for t in doc["topics"])
    if height is not None and rows > height - TABLE_CHROME:
        hidden = rows - max(0, height - TABLE_CHROME)
        title += (f" ({hidden} of {rows} rows below the screen: give a TOPIC, or --once "
                  "| less)")
    table = Table("topic", "part", "leader", "replicas", "msgs", "bytes", "depth", "pub/s",
                  "channel", "ch depth", "ch bytes", "in flight", "deferred", "lag", "clients",
                  "msg/s", title=title)
    for t in doc["topics"]:
        head = [t["topic"], _fmt(t["partition"]), t["leader"] or "[red](no leader)[/]",
                ", ".join(t["replicas"]), _fmt(t["message_count"]), _fmt(t["bytes"]),
                _fmt(t["depth"]), _fmt(t["rate"])]
        if not t["channels"]:
            table.add_row(*head, *["-"] * 8)
        for i, c in enumerate(t["channels"]):
            name = c["channel"] + (" (paused)" if c["paused"] else "")
            table.add_row(*(head if i == 0 else [""] * len(head)), name, _fmt(c["depth"]),
                          _fmt(c["depth_bytes"]), _fmt(c["in_flight"]), _fmt(c["deferred"]),
                          _fmt(c["lag"]), _fmt(c["clients"]), _fmt(c["rate"]))
    if not doc["topics"]:
        # an empty grid alone reads like a display fault (a new cluster, a deleted topic)
        answered = sum(1 for n in doc["nodes"] if not n["error"])
        table.caption = f"no topic on the {answered} nsqd that answered"
    errors = [f"[red]{n['http_address']}: {n['error']}[/]" for n in doc["nodes"] if n["error"]]
    if "client_metrics" not in doc:
        return Group(table, *errors)
    return Group(table, *errors, render_clients(doc))


def render_clients(doc: dict[str, Any]) -> Group:
    """The clients' side: per channel row, nsqd's depth and in flight beside what the
    clients of the given endpoints counted."""
    endpoints = doc["client_metrics"]
    table = Table("topic", "part", "channel", "depth", "in flight", "received", "finished",
                  "requeued", "given up", "client in flight", "fin/s",
                  title=f"client side ({len(endpoints)} endpoint(s))")
    for t in doc["topics"]:
        for c in t["channels"]:
            mine = c["client"]
            theirs = [_fmt(mine[k]) for k in ("received", "finished", "requeued", "given_up",
                                              "in_flight", "rate")] if mine else ["-"] * 6
            table.add_row(t["topic"], _fmt(t["partition"]), c["channel"], _fmt(c["depth"]),
                          _fmt(c["in_flight"]), *theirs)
    for u in doc["unmatched_clients"]:
        table.add_row(u["topic"], u["partition"] or "-", f"{u['channel']} @ {u['nsqd']}",
                      "-", "-", *(_fmt(u[k]) for k in ("received", "finished", "requeued",
                                                       "given_up", "in_flight")), "-")
    errors = [f"[red]{e['url']}: {e['error']}[/]" for e in endpoints if e["error"]]
    return Group(table, *errors)


def _endpoint(ctx: click.Context, param: click.Parameter,
              value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return tuple(endpoint_url(v) for v in value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@click.command(epilog=EPILOG)
@click.argument("topic", required=False, callback=topic_argument)
@cluster_options(nsqd_kind="http")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="seconds between refreshes")
@click.option("--once", is_flag=True, help="print one snapshot and exit")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table")
@click.option("--client-metrics", "client_metrics", multiple=True, metavar="URL",
              callback=_endpoint,
              help="the Prometheus endpoint of a running smartnsq process (HOST:PORT or a URL; "
                   "repeatable): show what its consumers counted beside each channel "
                   "(needs pip install 'smartnsq[prometheus]')")
@http_wire_options
@command_runner
async def stat(topic: str | None, lookupd: tuple[str, ...], nsqd: tuple[str, ...],
               interval: float, once: bool, as_json: bool,
               client_metrics: tuple[str, ...]) -> None:
    """Live statistics of every topic (or TOPIC) on every nsqd: partitions, leaders and
    replicas, depths, in flight, deferred, rates, lag, clients; with --client-metrics, the
    consuming clients' own counts beside them. Ctrl-C ends it."""
    # before the lookup, as the module's import was: a Ctrl-C here ends stat as there
    client = nsqd_http_client()
    cluster = pick_cluster(lookupd, nsqd)
    if client_metrics:
        try:
            check_installed()
        except ImportError as exc:
            raise CliError(str(exc)) from None
    tcp: dict[str, str] = {}
    if cluster.nsqd:
        nodes = list(cluster.nsqd)
    else:
        async with cluster.lookup() as lk:
            entries = await lk.admin.nodes()
        tcp = {n.http_address: n.tcp_address for n in entries if n.http_port}
        nodes = sorted(tcp)
        if not nodes:
            raise CliError(f"no nsqd registered with lookupd {', '.join(cluster.lookupd)}")
    async with client as http:
        clients = None
        if client_metrics:
            known = asyncio.get_running_loop().create_future()
            if cluster.nsqd:
                known = asyncio.ensure_future(tcp_addresses(http, nodes))
            else:
                known.set_result(tcp)
            clients = ClientSide(client_metrics, known)
        try:
            await _show(http, nodes, topic, interval, once, as_json, clients)
        finally:
            if clients is not None:
                clients.tcp.cancel()  # a first /stats that failed did not wait for it


async def _show(http: NsqdHttpClient, nodes: list[str], topic: str | None, interval: float,
                once: bool, as_json: bool, clients: ClientSide | None) -> None:
    stop = stop_event()
    # the live view does not wait for a hung nsqd at every refresh; --once asks it once
    hung = None if once else HungNodes()
    try:
        await _views(http, nodes, topic, interval, once, as_json, clients, stop, hung)
    finally:
        if hung is not None:
            hung.close()


async def _views(http: NsqdHttpClient, nodes: list[str], topic: str | None, interval: float,
                 once: bool, as_json: bool, clients: ClientSide | None, stop: asyncio.Event,
                 hung: HungNodes | None) -> None:
    sample = await unless_stopped(take_sample(http, nodes, topic, clients, hung), stop)
    if not sample.stats:
        raise CliError("no nsqd answered /stats: " + "; ".join(
            f"{a}: {e}" for a, e in sample.errors.items()))
    if topic is not None and not any(s["topics"] for s in sample.stats.values()):
        raise CliError(f"topic {topic!r} not found on nsqd {', '.join(sorted(sample.stats))}")

    async def after(asked: list[str] = nodes) -> Sample:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        return await unless_stopped(take_sample(http, asked, topic, clients, hung), stop)

    console = stdout_console()
    if once and not as_json:
        # a one-off snapshot shows rates too: measured over the interval, from the nsqds
        # that answered; one that did not is reported as it failed, not waited for twice
        first = sample
        sample = await after([n for n in nodes if n not in first.errors])
        sample.errors = {**first.errors, **sample.errors}
        with writing_stdout():
            console.print(render(build_doc(sample, first)))
        return
    if once:
        echo(json.dumps(build_doc(sample, None)))
        return
    if as_json or not console.is_terminal:
        await _stream(sample, after, stop, as_json, console)
        return
    last: Sample | None = None
    with Live(render(build_doc(sample, None), console.height), console=console,
              auto_refresh=False) as live:
        while not stop.is_set():
            live.update(render(build_doc(sample, last), console.height), refresh=True)
            last, sample = sample, await after()


async def _stream(sample: Sample, after: Callable[[], Awaitable[Sample]], stop: asyncio.Event,
                  as_json: bool, console: Console) -> None:
    """One JSON line or one plain table per refresh (rates from the second on), each
    flushed: a pipe or a file gets them as they come, where a live table would show only
    at the end. Ends on Ctrl-C, or as soon as a pipe's reader has gone (``| head``)."""

    async def watch() -> None:
        await stdout_gone()
        stop.set()

    watcher = asyncio.ensure_future(watch())
    previous: Sample | None = None
    try:
        while not stop.is_set():
            doc = build_doc(sample, previous)
            if as_json:
                echo(json.dumps(doc))
            else:
                with writing_stdout():
                    console.print(render(doc))
            previous, sample = sample, await after()
    finally:
        watcher.cancel()
