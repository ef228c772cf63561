"""``smartnsq lookup TOPIC``: the merged lookup view (partitions, leaders, nodes, meta, which
lookupds answered, demoted lookupds), plus each partition's replicas from the nsqds' /stats
(lookupd only names leaders)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from smartnsq.cli.common import (
    CliError,
    cluster_options,
    echo,
    pick_cluster,
    stdout_console,
    writing_stdout,
)
from smartnsq.cli.common import topic_argument as _topic
from smartnsq.cli.stopping import command_runner

# rich, the lookup client and stat's sampling load when the command runs, not for --help
if TYPE_CHECKING:
    from rich.console import Console

    from smartnsq.lookup import Lookup, LookupdStatus, Node, TopicView

EPILOG = """\b
Examples:
  smartnsq lookup orders --lookupd 127.0.0.1:4161
  smartnsq lookup orders --lookupd 127.0.0.1:4161 --access w --json
"""


def node_json(node: Node) -> dict[str, Any]:
    return {"address": node.address, "http_address": node.http_address,
            "hostname": node.hostname, "version": node.version,
            "distributed_id": node.distributed_id}


def view_json(view: TopicView, lookupds: tuple[LookupdStatus, ...],
              leader: str | None) -> dict[str, Any]:
    return {
        "topic": view.topic,
        "access": view.access,
        "flavour": view.flavour.value,
        "not_found": view.not_found,
        "partition_num": view.partition_num,
        "meta": {"partition_num": view.meta.partition_num, "replica": view.meta.replica,
                 "ordered": view.meta.ordered, "extend_support": view.meta.extend_support,
                 "multi_part": view.meta.multi_part,
                 "disable_channel_auto_create": view.meta.disable_channel_auto_create}
        if view.has_meta else None,
        "partitions": {str(p): node_json(n) for p, n in view.partitions.items()},
        "missing_partitions": list(view.missing_partitions),
        "nodes": [node_json(n) for n in view.nodes.values()],
        "legacy_nodes": list(view.legacy_nodes),
        "channels": list(view.channels),
        "answered_by": list(view.answered_by),
        "failed": dict(view.failed),
        "lookupd_leader": leader,
        "lookupds": [{"address": s.address, "seed": s.seed, "leader": s.leader,
                      "demoted": s.demoted, "consecutive_failures": s.consecutive_failures,
                      "last_error": s.last_error} for s in lookupds],
    }


def print_view(console: Console, doc: dict[str, Any]) -> None:
    from rich.table import Table

    meta = doc["meta"]
    head = f"[bold]{doc['topic']}[/] ({doc['flavour']}, access={doc['access']})"
    if meta is not None:
        flags = [k for k in ("ordered", "extend_support", "multi_part",
                             "disable_channel_auto_create") if meta[k]]
        head += (f": {meta['partition_num']} partition(s), replica {meta['replica']}"
                 + (f", {', '.join(flags)}" if flags else ""))
    console.print(head)
    if doc["partitions"] or doc["missing_partitions"]:
        table = Table("partition", "leader", "http", "distributed id", "version",
                      "replicas (nsqd http)")
        replicas = doc.get("replicas", {})
        for p, n in doc["partitions"].items():
            table.add_row(p, n["address"], n["http_address"], n["distributed_id"], n["version"],
                          ", ".join(replicas.get(p, [])))
        for p in doc["missing_partitions"]:
            table.add_row(str(p), "[red](no leader)[/]", "", "", "",
                          ", ".join(replicas.get(str(p), [])))
        console.print(table)
    if doc["legacy_nodes"]:
        table = Table("nsqd (no partition)", "http", "hostname", "version")
        for n in doc["nodes"]:
            if n["address"] in doc["legacy_nodes"]:
                table.add_row(n["address"], n["http_address"], n["hostname"], n["version"])
        console.print(table)
    console.print(f"channels: {', '.join(doc['channels']) or '(none)'}")
    table = Table("lookupd", "role", "state", "last error")
    for s in doc["lookupds"]:
        role = "leader" if s["leader"] else ("seed" if s["seed"] else "discovered")
        state = "answered" if s["address"] in doc["answered_by"] else (
            "[red]demoted[/]" if s["demoted"] else "[yellow]failed[/]")
        table.add_row(s["address"], role, state,
                      doc["failed"].get(s["address"]) or s["last_error"] or "")
    console.print(table)


@click.command(epilog=EPILOG)
@click.argument("topic", callback=_topic)
@cluster_options(nsqd=False)
@click.option("--access", type=click.Choice(["r", "w"]), default="r", show_default=True,
              help="the consumers' (r) or the producers' (w) view")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
@command_runner
async def lookup(topic: str, lookupd: tuple[str, ...], access: str, as_json: bool) -> None:
    """Show how the lookupds see TOPIC, merged the way the clients merge it."""
    cluster = pick_cluster(lookupd, (), allow_nsqd=False)
    async with cluster.lookup() as lk:
        doc = await lookup_doc(lk, topic, access)
    # youzan answers access=r for an unknown topic with empty lists and no meta
    if not doc["nodes"] and (doc["not_found"] or not (doc["meta"] or {}).get("partition_num")):
        raise CliError(f"topic {topic!r} not found on lookupd "
                       f"{', '.join(doc['answered_by'])}")
    if as_json:
        echo(json.dumps(doc, indent=2))
        return
    with writing_stdout():
        print_view(stdout_console(), doc)


async def lookup_doc(lk: Lookup, topic: str, access: str) -> dict[str, Any]:
    view = await lk.lookup(topic, access)
    doc = view_json(view, lk.lookupds(), lk.leader)
    if view.is_partitioned:
        doc["replicas"] = await replicas(lk, topic)
    return doc


async def replicas(lk: Lookup, topic: str) -> dict[str, list[str]]:
    """Partition → nsqds (HTTP addresses) holding a replica that is not the leader. lookupd
    only names leaders; each nsqd's ``/stats`` says which partitions it holds."""
    from smartnsq.cli.stat import build_doc
    from smartnsq.cli.stat_sample import take_sample
    from smartnsq.nsqd_http import NsqdHttpClient

    nodes = sorted({n.http_address for n in await lk.admin.nodes() if n.http_port})
    async with NsqdHttpClient() as nsqd:
        sample = await take_sample(nsqd, nodes, topic)
    out: dict[str, list[str]] = {}
    for row in build_doc(sample, None)["topics"]:
        if row["topic"] == topic and row["partition"] is not None:
            out[str(row["partition"])] = row["replicas"]
    return out
