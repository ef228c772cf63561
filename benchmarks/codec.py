"""Codec throughput: MPUB encode and frame+message decode, stock and youzan layouts.

Prints messages/s on one core for 100-byte bodies. Usage: python benchmarks/codec.py [--seconds S]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from smartnsq.protocol import (
    FRAME_MESSAGE,
    FrameDecoder,
    MessageLayout,
    commands,
    encode_frame,
    encode_message,
    youzan_id,
)

BODY = b"x" * 100
BATCH = 100


def _rate(fn: Callable[[], int], seconds: float) -> float:
    """Messages per second of ``fn`` (which returns how many messages it handled)."""
    fn()  # warm caches
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        n += fn()
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def bench_mpub_encode(partition: int | None) -> Callable[[], int]:
    bodies = [BODY] * BATCH

    def run() -> int:
        for _ in range(100):
            commands.mpub("bench_topic", bodies, partition)
        return 100 * BATCH

    return run


def bench_decode(layout: MessageLayout, youzan: bool) -> Callable[[], int]:
    frames = []
    for i in range(1, 1001):
        msg_id = youzan_id(i, 0) if youzan else b"%016x" % i
        data = encode_message(time.time_ns(), 1, msg_id, BODY,
                              ext_version=0 if layout.ext else None,
                              offset=i * 130 if layout.position else None,
                              raw_size=130 if layout.position else None)
        frames.append(encode_frame(FRAME_MESSAGE, data))
    # realistic read sizes: 64 KiB chunks of the stream
    stream = b"".join(frames)
    chunks = [stream[i:i + 65536] for i in range(0, len(stream), 65536)]

    def run() -> int:
        # the connection's receive path: the one decoder, records out
        dec = FrameDecoder()
        n = 0
        for chunk in chunks:
            n += len(dec.feed_records(chunk, layout))
        return n

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    rows = [
        ("MPUB encode, batch 100 (stock: MPUB t)", bench_mpub_encode(None)),
        ("MPUB encode, batch 100 (youzan: MPUB t p)", bench_mpub_encode(3)),
        ("frame+message decode (stock layout)", bench_decode(MessageLayout(), False)),
        ("frame+message decode (youzan SUB_ORDERED layout)",
         bench_decode(MessageLayout(position=True), True)),
        ("frame+message decode (youzan ext + position)",
         bench_decode(MessageLayout(ext=True, position=True), True)),
    ]
    print(f"codec benchmark, 100-byte bodies, {args.seconds:.1f} s per row, one core")
    for name, fn in rows:
        print(f"  {name:<52} {_rate(fn, args.seconds):>12,.0f} msg/s")


if __name__ == "__main__":
    main()
