"""``smartnsq stat [TOPIC]``: a live table of every topic partition and channel (like
``nsq_stat``, partition-aware), built from each nsqd's own ``/stats``.

Per partition (youzan) or per nsqd (stock): leader and replicas, messages stored, retained
bytes (youzan), topic depth (stock), publishing clients and the publish rate. Per channel:
depth (messages waiting) and its bytes (youzan ``depth_size``), in flight, deferred,
requeued, timed out, connected clients, the consume rate and the lag: every message not yet
finished (depth + in flight + deferred). Rates are the difference between two refreshes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table

from smartnsq.cli.common import (
    CliError,
    cluster_options,
    command_runner,
    pick_cluster,
    stdout_console,
    stop_event,
    topic_argument,
)
from smartnsq.errors import NsqdHttpError, ServerError
from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.protocol.validation import NO_PARTITION

EPILOG = """\b
Examples:
  smartnsq stat --lookupd 127.0.0.1:4161
  smartnsq stat orders --lookupd 127.0.0.1:4161 --interval 5
  smartnsq stat --nsqd 127.0.0.1:4151 --nsqd 127.0.0.1:4251 --once --json
"""


def _int(doc: dict[str, Any], key: str) -> int:
    v = doc.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


@dataclass
class Sample:
    """One refresh: the nsqds' answers and the time they were taken."""

    at: float
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


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
    for (name, part, _), entries in sorted(groups.items()):
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
    return {"at": sample.at, "nodes": nodes, "topics": topics}


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


def render(doc: dict[str, Any]) -> Group:
    table = Table("topic", "part", "leader", "replicas", "msgs", "bytes", "depth", "pub/s",
                  "channel", "ch depth", "ch bytes", "in flight", "deferred", "lag", "clients",
                  "msg/s", title=time.strftime("smartnsq stat %H:%M:%S",
                                               time.localtime(doc["at"])))
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
    errors = [f"[red]{n['http_address']}: {n['error']}[/]" for n in doc["nodes"] if n["error"]]
    return Group(table, *errors)


async def take_sample(nsqd: NsqdHttpClient, nodes: list[str], topic: str | None) -> Sample:
    sample = Sample(at=time.time())

    async def one(addr: str) -> None:
        try:
            sample.stats[addr] = await nsqd.stats(addr, topic)
        except NsqdHttpError as exc:
            sample.errors[addr] = exc.reason if exc.status is None else str(exc)
        except ServerError as exc:
            sample.errors[addr] = str(exc)

    await asyncio.gather(*(one(a) for a in nodes))
    return sample


@click.command(epilog=EPILOG)
@click.argument("topic", required=False, callback=topic_argument)
@cluster_options(nsqd_kind="http")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="seconds between refreshes")
@click.option("--once", is_flag=True, help="print one snapshot and exit")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table")
@command_runner
async def stat(topic: str | None, lookupd: tuple[str, ...], nsqd: tuple[str, ...],
               interval: float, once: bool, as_json: bool) -> None:
    """Live statistics of every topic (or TOPIC) on every nsqd: partitions, leaders and
    replicas, depths, in flight, deferred, rates, lag, clients. Ctrl-C ends it."""
    cluster = pick_cluster(lookupd, nsqd)
    if cluster.nsqd:
        nodes = list(cluster.nsqd)
    else:
        async with cluster.lookup() as lk:
            entries = await lk.admin.nodes()
        nodes = sorted({n.http_address for n in entries if n.http_port})
        if not nodes:
            raise CliError(f"no nsqd registered with lookupd {', '.join(cluster.lookupd)}")
    async with NsqdHttpClient() as http:
        await _show(http, nodes, topic, interval, once, as_json)


async def _show(http: NsqdHttpClient, nodes: list[str], topic: str | None, interval: float,
                once: bool, as_json: bool) -> None:
    stop = stop_event()
    sample = await take_sample(http, nodes, topic)
    if not sample.stats:
        raise CliError("no nsqd answered /stats: " + "; ".join(
            f"{a}: {e}" for a, e in sample.errors.items()))
    if topic is not None and not any(s["topics"] for s in sample.stats.values()):
        raise CliError(f"topic {topic!r} not found on nsqd {', '.join(sorted(sample.stats))}")

    async def after() -> Sample:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        return await take_sample(http, nodes, topic)

    if once and not as_json:
        # a one-off snapshot shows rates too: measured over the interval
        first, sample = sample, await after()
        stdout_console().print(render(build_doc(sample, first)))
        return
    if as_json:
        # one JSON document per line and refresh (rates from the second on)
        previous: Sample | None = None
        while True:
            click.echo(json.dumps(build_doc(sample, previous)))
            if once:
                return
            previous, sample = sample, await after()
            if stop.is_set():
                return
    last: Sample | None = None
    with Live(render(build_doc(sample, None)), console=stdout_console(),
              auto_refresh=False) as live:
        while not stop.is_set():
            live.update(render(build_doc(sample, last)), refresh=True)
            last, sample = sample, await after()
