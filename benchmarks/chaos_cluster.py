"""The embedded youzan cluster for the chaos soak, in its own process, driven over stdin.

``benchmarks/chaos.py`` runs this as a subprocess so that the double's CPU and memory (it
keeps every stored message) are not counted as the client's. It prints one JSON line
``{"ready": {...addresses...}}`` and then answers one JSON line per request line
``{"op": NAME, "args": {...}}`` with ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "..."}``. It exits when stdin closes.

Usage (normally only through chaos.py): python benchmarks/chaos_cluster.py --nodes 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.lookupd.faulting import LookupdFaultKind

Op = Callable[..., Awaitable[Any]]


def _ops(cluster: DevCluster) -> dict[str, Op]:
    async def create_topic(name: str, partition_num: int, replica: int, ordered: bool,
                           channels: list[str]) -> None:
        cluster.create_topic(name, partition_num=partition_num, replica=replica,
                             ordered=ordered, channels=channels)

    async def leaders(topic: str) -> dict[str, int | None]:
        t = cluster.meta.topics[topic]
        return {str(p): cluster.leader(topic, p) for p in t.partitions}

    async def move_leader(topic: str, partition: int) -> list[int | None]:
        old = cluster.leader(topic, partition)
        new = cluster.move_leader(topic, partition)
        return [old, new]

    async def stop_node(node: int) -> None:
        await cluster.stop_node(node)

    async def start_node(node: int) -> None:
        await cluster.start_node(node)

    async def lookupd_fault(kind: LookupdFaultKind) -> None:
        await cluster.lookupd_fault(0, kind)

    async def clear_lookupd_fault() -> None:
        await cluster.clear_lookupd_fault(0)

    async def delay_responses(node: int, seconds: float) -> None:
        cluster.delay_responses(node, seconds)

    async def drop_clients(node: int) -> int:
        return cluster.drop_client(node)

    async def node_ids() -> list[str]:
        # the distributed ids lookupd's move API takes, by node index
        return [cluster.meta.nodes[n.node_id].distributed_id for n in cluster.nodes]

    async def stored(topic: str) -> int:
        t = cluster.meta.topics[topic]
        return sum(len(cluster.store.partition(topic, p).records) for p in t.partitions)

    async def rss_peak_kib() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    return {f.__name__: f for f in (create_topic, leaders, move_leader, stop_node, start_node,
                                     lookupd_fault, clear_lookupd_fault, delay_responses,
                                     drop_clients, node_ids, stored, rss_peak_kib)}


async def serve(nodes: int, move_seconds: float) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with DevCluster(nodes=nodes, lookupds=1, flavour="youzan",
                          leader_move_seconds=move_seconds) as cluster:
        ops = _ops(cluster)
        ready = {"lookupd_http": cluster.lookupd_http_addresses,
                 "nsqd_tcp": cluster.nsqd_tcp_addresses, "pid": os.getpid()}
        print(json.dumps({"ready": ready}), flush=True)
        while line := await reader.readline():
            answer: dict[str, Any]
            try:
                req = json.loads(line)
                op = ops.get(req.get("op"))
                if op is None:
                    raise ValueError(f"unknown op {req.get('op')!r}")
                answer = {"ok": True, "result": await op(**req.get("args", {}))}
            except Exception as exc:
                # the caller decides whether a refused fault matters; the cluster stays up
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--leader-move-seconds", type=float, default=2.0,
                    help="how long a move through lookupd's API leaves the partition "
                         "leaderless (the real cluster: 4-7 s)")
    args = ap.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.nodes, args.leader_move_seconds))
    else:
        uvloop.run(serve(args.nodes, args.leader_move_seconds))


if __name__ == "__main__":
    main()
