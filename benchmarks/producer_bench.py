"""Producer throughput: messages/s and client CPU µs per message, 100-byte bodies.

Scenarios (each a function returning a :class:`Result`, for ``benchmarks/throughput.py``):
PUB one-at-a-time, PUB with many in flight, auto-batched publish, MPUB batch 100 pipelined
(stock nsqd); sharded ordered publish (plain and auto-batched) and traced publish (youzan,
through lookupd).

By default the embedded cluster runs in a subprocess (``python -m smartnsq.devcluster``), so
the CPU time measured here (process CPU time ÷ messages) is the client's alone; a fresh
cluster serves each scenario. ``--nsqd HOST:PORT`` runs the stock scenarios against a real
nsqd instead, ``--lookupd HOST:PORT`` the youzan ones against a real cluster (topic
``--youzan-topic``, which must exist with a channel on every partition).

Usage: python benchmarks/producer_bench.py [--nsqd HOST:PORT] [--lookupd HOST:PORT]
       [--scale F] [--loop uvloop|asyncio] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import BODY, Meter, Result, embedded_cluster

from smartnsq.config import ProducerConfig
from smartnsq.producer import Producer

STOCK_TOPIC = "bench"
YOUZAN_TOPIC = "bench_y"
YOUZAN_PARTITIONS = 4


async def measure(scenario: str, messages: int,
                  run: Callable[[], Awaitable[None]]) -> Result:
    meter = Meter()
    meter.start()
    await run()
    meter.stop()
    return Result("smartnsq", scenario, messages, meter.wall, meter.cpu, meter.sys)


def cluster_process(flavour: str, nodes: int,
                    topic: str) -> contextlib.AbstractContextManager[dict[str, list[str]]]:
    """``python -m smartnsq.devcluster`` in a subprocess; yields its addresses by kind."""
    return embedded_cluster(flavour, nodes, (topic,))


async def _warm(p: Producer, topic: str, **kw: object) -> None:
    # connections, lookups and code paths warm before the clock starts
    await asyncio.gather(*(p.publish(topic, BODY, **kw) for _ in range(200)))  # type: ignore[arg-type]


async def _workers(n: int, concurrency: int,
                   one: Callable[[int, int], Awaitable[object]]) -> None:
    """``concurrency`` tasks call ``one(worker, i)`` one after another, ``n`` calls in all."""
    per, extra = divmod(n, concurrency)

    async def worker(w: int) -> None:
        for i in range(per + (w < extra)):
            await one(w, i)

    await asyncio.gather(*(worker(w) for w in range(concurrency)))


async def _callers(n: int, concurrency: int, call: Callable[..., Awaitable[object]],
                   *args: object) -> None:
    """``concurrency`` tasks await ``call(*args)`` one after another, ``n`` calls in all: the
    raw loop's callers (peer_raw.py), with no function of the benchmark's between them and
    the client."""
    per, extra = divmod(n, concurrency)

    async def caller(k: int) -> None:
        for _ in range(k):
            await call(*args)

    await asyncio.gather(*(caller(per + (w < extra)) for w in range(concurrency)))


# ---------------------------------------------------------------------- stock scenarios

async def pub_one_at_a_time(nsqd: str, n: int, topic: str = STOCK_TOPIC) -> Result:
    async with Producer(nsqd=[nsqd]) as p:
        await _warm(p, topic)

        async def run() -> None:
            for _ in range(n):
                await p.publish(topic, BODY)

        return await measure("PUB one-at-a-time", n, run)


async def pub_in_flight(nsqd: str, n: int, concurrency: int = 1000,
                        topic: str = STOCK_TOPIC) -> Result:
    async with Producer(nsqd=[nsqd]) as p:
        await _warm(p, topic)

        async def run() -> None:
            await _callers(n, concurrency, p.publish, topic, BODY)

        return await measure(f"PUB {concurrency} in flight", n, run)


async def pub_auto_batched(nsqd: str, n: int, concurrency: int = 5000,
                           linger: float = 0.001, max_batch: int = 500,
                           topic: str = STOCK_TOPIC) -> Result:
    cfg = ProducerConfig(linger=linger, max_batch=max_batch)
    async with Producer(nsqd=[nsqd], config=cfg) as p:
        await _warm(p, topic)

        async def run() -> None:
            await _callers(n, concurrency, p.publish, topic, BODY)

        return await measure(f"auto-batched publish ({concurrency} callers)", n, run)


async def mpub_pipelined(nsqd: str, n: int, batch: int = 100, in_flight: int = 50,
                         topic: str = STOCK_TOPIC) -> Result:
    bodies = [BODY] * batch
    calls = n // batch
    async with Producer(nsqd=[nsqd]) as p:
        await _warm(p, topic)

        async def run() -> None:
            await _callers(calls, in_flight, p.publish_many, topic, bodies)

        return await measure(f"MPUB x{batch} pipelined", calls * batch, run)


# ---------------------------------------------------------------------- youzan scenarios

async def ordered_sharded(lookupd: str, n: int, keys: int = 100, linger: float = 0.0,
                          topic: str = YOUZAN_TOPIC) -> Result:
    cfg = ProducerConfig(linger=linger, max_batch=500)
    async with Producer(lookupd=[lookupd], config=cfg) as p:
        await _warm(p, topic)
        names = [f"key-{k}" for k in range(keys)]

        async def run() -> None:
            # one caller per key keeps its messages in order; keys run in parallel
            await _workers(n, keys, lambda w, i: p.publish_ordered(topic, names[w], BODY))

        scenario = f"sharded ordered publish ({keys} keys"
        scenario += f", linger {linger * 1000:g} ms)" if linger else ")"
        return await measure(scenario, n, run)


async def ordered_sharded_batched(lookupd: str, n: int, keys: int = 100,
                                  topic: str = YOUZAN_TOPIC) -> Result:
    # many callers per key, so that a key's lane has work queued while its message is out
    cfg = ProducerConfig(linger=0.001, max_batch=500)
    async with Producer(lookupd=[lookupd], config=cfg) as p:
        await _warm(p, topic)
        names = [f"key-{k}" for k in range(keys)]

        async def run() -> None:
            await _workers(n, keys * 20,
                           lambda w, i: p.publish_ordered(topic, names[w % keys], BODY))

        return await measure(f"sharded ordered publish ({keys} keys, 20 callers/key, "
                             "linger 1 ms)", n, run)


async def traced_publish(lookupd: str, n: int, concurrency: int = 1000,
                         topic: str = YOUZAN_TOPIC) -> Result:
    async with Producer(lookupd=[lookupd]) as p:
        await _warm(p, topic, trace_id=1)

        async def run() -> None:
            await _workers(n, concurrency, lambda w, i: p.publish(topic, BODY, trace_id=i + 1))

        return await measure(f"traced publish (PUB_TRACE, {concurrency} in flight)", n, run)


# ---------------------------------------------------------------------- runner

StockCase = tuple[str, Callable[[str, int], Awaitable[Result]], int]
STOCK_CASES: list[StockCase] = [
    ("pub_serial", pub_one_at_a_time, 20_000),
    ("pub_inflight", pub_in_flight, 200_000),
    ("pub_batched", pub_auto_batched, 500_000),
    ("mpub", mpub_pipelined, 1_000_000),
]
YOUZAN_CASES: list[StockCase] = [
    ("ordered", ordered_sharded, 100_000),
    ("ordered_batched", ordered_sharded_batched, 300_000),
    ("traced", traced_publish, 100_000),
]


def run_producer_benchmarks(nsqd: str | None = None, lookupd: str | None = None,
                            scale: float = 1.0, only: tuple[str, ...] = (),
                            loop: str = "uvloop",
                            youzan_topic: str = YOUZAN_TOPIC) -> list[Result]:
    """Run the scenarios (each on a fresh embedded cluster unless addresses are given) and
    return their results; used by ``main()`` and by the shared throughput benchmark."""
    results: list[Result] = []
    for name, fn, count in STOCK_CASES + YOUZAN_CASES:
        if only and name not in only:
            continue
        n = max(1000, int(count * scale))
        youzan = (name, fn, count) in YOUZAN_CASES
        given = lookupd if youzan else nsqd
        with contextlib.ExitStack() as stack:
            if given is None:
                if youzan:
                    addrs = stack.enter_context(cluster_process(
                        "youzan", YOUZAN_PARTITIONS, f"{YOUZAN_TOPIC}:{YOUZAN_PARTITIONS}:1"))
                    target = addrs["lookupd_http"][0]
                else:
                    addrs = stack.enter_context(cluster_process("stock", 1, STOCK_TOPIC))
                    target = addrs["nsqd_tcp"][0]
            else:
                target = given
            coro = fn(target, n, topic=youzan_topic) if youzan else fn(target, n)  # type: ignore[call-arg]
            results.append(_run(coro, loop))
        print_result(results[-1])
    return results


def _run(coro: Awaitable[Result], loop: str) -> Result:
    async def main() -> Result:
        return await coro

    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            loop = "asyncio"
        else:
            return uvloop.run(main())  # type: ignore[no-any-return]
    return asyncio.run(main())


def print_result(r: Result) -> None:
    print(f"{r.scenario:<62} {r.rate:>12,.0f} msg/s {r.cpu_us_per_msg:>8.2f} µs/msg client CPU"
          f"  ({r.messages:,} msgs, {r.wall:.2f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd", help="HOST:PORT of a stock nsqd (default: embedded)")
    parser.add_argument("--lookupd", help="HOST:PORT of a youzan nsqlookupd (default: embedded)")
    parser.add_argument("--youzan-topic", default=YOUZAN_TOPIC)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--only", nargs="*", default=[],
                        choices=[c[0] for c in STOCK_CASES + YOUZAN_CASES])
    args = parser.parse_args(argv)
    print(f"smartnsq producer, {len(BODY)}-byte bodies, loop={args.loop}, "
          f"server={'given' if args.nsqd or args.lookupd else 'embedded (subprocess)'}, "
          f"cpus={os.cpu_count()}")
    run_producer_benchmarks(args.nsqd, args.lookupd, args.scale, tuple(args.only), args.loop,
                            args.youzan_topic)
    return 0


if __name__ == "__main__":
    sys.exit(main())
