"""Publishes during a partition leader move: how many fail, and is anything lost or reordered?

Creates an ordered topic (2 partitions, 2 replicas), publishes with ``publish_ordered`` over
``--keys`` shard keys from ``--workers`` concurrent tasks (each key's messages in sequence),
moves partition 0's leader through lookupd's ``/topic/partition/move`` a few seconds in, keeps
publishing until the move took effect plus ``--after`` seconds, then consumes everything with
the OrderedConsumer and checks that every acknowledged message arrived once per key in order.
Prints failed publishes (with their errors), move duration and the checks.

Against a real youzan cluster (three nsqd): ``--lookupd HOST:PORT``; without it, the embedded
cluster with a modelled leaderless window of ``--double-move`` seconds.

Usage: python benchmarks/leader_move.py [--lookupd HOST:PORT] [--keys 200] [--workers 50]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time
from contextlib import AsyncExitStack, suppress

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import itertools

import aiohttp

from smartnsq.config import ConsumerConfig, ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.message import Message
from smartnsq.ordered.consumer import OrderedConsumer
from smartnsq.producer import Producer
from tests.real_servers import HTTP_TIMEOUT, YouzanCluster


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> int:
    async with AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession(timeout=HTTP_TIMEOUT))
        if args.lookupd:
            target = YouzanCluster("real", args.lookupd, session)
        else:
            cluster = await stack.enter_async_context(DevCluster(
                nodes=3, flavour="youzan", leader_move_seconds=args.double_move))
            target = YouzanCluster("double", cluster.lookupd_http_addresses[0], session, cluster)
        stack.push_async_callback(target.cleanup)
        await target.node_ids()
        topic = await target.create_topic("leadermove", partition_num=2, replicator=2,
                                          ordered=True)
        name = topic.name
        producer = await stack.enter_async_context(Producer(
            lookupd=[target.lookupd],
            config=ProducerConfig(publish_timeout=args.timeout)))
        acked: dict[str, list[int]] = collections.defaultdict(list)
        failures: collections.Counter[str] = collections.Counter()
        stop = asyncio.Event()
        published = 0

        async def worker(w: int) -> None:
            nonlocal published
            keys = [f"k{k}" for k in range(w, args.keys, args.workers)]
            seq = 0
            while not stop.is_set():
                for key in keys:
                    try:
                        await producer.publish_ordered(name, key, f"{key}:{seq}".encode())
                    except Exception as exc:
                        text = f"{type(exc).__name__}: {exc}"[:200]
                        if text not in failures:
                            progress(f"publish failed: {text}")
                        failures[text] += 1
                        await asyncio.sleep(0.01)  # an instant failure must not starve the loop
                    else:
                        acked[key].append(seq)
                        published += 1
                seq += 1

        tasks = [asyncio.create_task(worker(w)) for w in range(args.workers)]
        await asyncio.sleep(args.before)
        before = published
        t0 = time.monotonic()
        old, new = await target.move_leader(name, 0, None)
        progress(f"moving partition 0 {old.distributed_id} -> {new} ({published} published)")
        await target.wait_leader(name, 0, new)
        moved_in = time.monotonic() - t0
        progress(f"moved in {moved_in:.1f} s ({published} published)")
        await asyncio.sleep(args.after)
        stop.set()
        await asyncio.gather(*tasks)
        progress(f"publishing stopped ({published} published)")
        total_failed = sum(failures.values())
        print(f"target: {target.kind} cluster; topic {name}; partition 0 moved "
              f"{old.distributed_id} -> {new} in {moved_in:.1f} s")
        print(f"publishes acknowledged: {published} ({before} before the move); "
              f"failed: {total_failed}")
        for text, n in failures.most_common(5):
            print(f"  {n} x {text}")

        # consume everything back: each key's acknowledged messages, once, in order
        want = sum(len(v) for v in acked.values())
        missing = {(k, s) for k, v in acked.items() for s in v}
        seen: dict[str, list[int]] = collections.defaultdict(list)
        done = asyncio.Event()
        count = 0

        async def handle(msg: Message) -> None:
            nonlocal count
            key, seq = msg.body.decode().split(":")
            seen[key].append(int(seq))
            count += 1  # redeliveries included
            missing.discard((key, int(seq)))
            if not missing:
                done.set()

        consumer = OrderedConsumer(name, "ch", handle, lookupd=[target.lookupd],
                                   config=ConsumerConfig(max_in_flight=200))
        async with consumer:
            with suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), args.consume_timeout)
        lost = sum(len(set(v) - set(seen.get(k, []))) for k, v in acked.items())
        # a failed publish may still have been stored (no answer): extra seqs are allowed,
        # acknowledged ones must keep their relative order
        out_of_order = 0
        for k, v in acked.items():
            pos: dict[int, int] = {}
            for i, s in enumerate(seen.get(k, [])):
                pos.setdefault(s, i)  # first delivery; redeliveries come later
            order = [pos[s] for s in v if s in pos]
            out_of_order += sum(1 for a, b in itertools.pairwise(order) if b < a)
        print(f"consumed {count} (redeliveries included) for {want} acknowledged; "
              f"acknowledged but not consumed: {lost}; out-of-order pairs: {out_of_order}")
        return 1 if (total_failed or lost or out_of_order) else 0
    return 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lookupd", help="a real youzan nsqlookupd HOST:PORT (default: embedded)")
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--workers", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=10.0, help="publish timeout (s)")
    ap.add_argument("--before", type=float, default=2.0, help="publishing before the move (s)")
    ap.add_argument("--after", type=float, default=2.0, help="publishing after the move (s)")
    ap.add_argument("--double-move", type=float, default=2.0,
                    help="embedded cluster: seconds a move leaves the partition leaderless")
    ap.add_argument("--consume-timeout", type=float, default=60.0)
    sys.exit(asyncio.run(run(ap.parse_args())))


if __name__ == "__main__":
    main()
