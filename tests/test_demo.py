"""The README's main job (smartnsq.demo): a small run checked against independent
computations, the command line as ``make demo`` runs it, and failure reporting."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from smartnsq import demo
from smartnsq.demo import DemoSummary, render, run_demo
from tests.test_producer_support import murmur3_32_reference

ROOT = Path(__file__).resolve().parent.parent


async def test_small_run_holds_every_check() -> None:
    messages, keys = 2_000, 50
    lines: list[str] = []
    s = await run_demo(messages, keys, seed=3, time_limit=60, report=lines.append)
    assert s.ok, s.failures
    assert s.published == s.consumed == messages and s.missing == 0
    assert s.deliveries == s.consumed + s.redeliveries
    assert s.order_held and s.out_of_order_keys == ()
    assert s.violations == 0 and s.gaps == 0 and s.misplaced == 0 and s.unexpected == 0
    assert s.consumer_error is None and not s.timed_out and s.requeued == 0
    # placement, recomputed with the independent murmur3
    plan = demo.plan_messages(messages, keys)
    per_partition = [0] * 4
    for key, n in zip(demo.make_keys(keys, 3), plan, strict=True):
        per_partition[murmur3_32_reference(key.encode()) % 4] += n
    assert [p.published for p in s.partitions] == per_partition
    assert sum(p.keys for p in s.partitions) == keys
    for p in s.partitions:
        assert p.stored >= p.published
        assert p.position == p.last_offset is not None
        assert p.subscribed == p.leader_address
        assert p.violations == 0 and p.gaps == 0
    # two leaders moved halfway, to the partitions' other replica, and the output says so
    assert len(s.leader_moves) == 2
    assert all(m.from_node != m.to_node and m.after_published >= messages // 2
               for m in s.leader_moves)
    moved = {m.partition: m.to_node for m in s.leader_moves}
    assert all(s.partitions[p].leader == node for p, node in moved.items())
    assert sum(line.startswith("leader move: partition") for line in lines) == 2
    assert s.publish_rate > 0 and s.consume_rate > 0
    text = render(s)
    assert "order held     yes" in text and text.rstrip().endswith("every check held")


def test_command_line_run() -> None:
    proc = subprocess.run(
        # the Spark stage has its own test (tests/spark/test_demo_spark.py)
        [sys.executable, "-m", "smartnsq.demo", "--messages", "500", "--keys", "20",
         "--no-spark"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for expected in ("cluster up: lookupd http://127.0.0.1:", "leader move: partition",
                     "published 500 messages", "messages       published 500 of 500",
                     "consumed 500", "order held     yes", "offsets        gaps 0, violations 0",
                     "every message on shard_partition(key, 4): yes", "throughput     publish",
                     "result: OK", "spark stage skipped: --no-spark was given"):
        assert expected in out, out


def _failed(s: DemoSummary, **changes: object) -> DemoSummary:
    return demo._with_failures(dataclasses.replace(s, **changes))  # type: ignore[arg-type]


def test_failures_are_reported_and_fail_the_exit_code(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    good = asyncio.run(run_demo(200, 10, seed=1, time_limit=60))
    assert good.ok, good.failures
    bad = _failed(good, missing=3, out_of_order_keys=("cust-1",), violations=1, gaps=2,
                  misplaced=4, consumer_error="OrderViolationError('x')")
    assert not bad.ok and not bad.order_held
    assert len(bad.failures) == 6
    text = render(bad)
    assert "result: FAILED" in text and "3 acknowledged messages never handled" in text
    assert "order held     no" in text
    last = dataclasses.replace(good.partitions[0], position=0, last_offset=45)
    assert "final position 0" in " ".join(
        _failed(good, partitions=(last, *good.partitions[1:])).failures)

    async def fake_run(*args: object, **kw: object) -> DemoSummary:
        return bad

    monkeypatch.setattr(demo, "run_demo", fake_run)
    assert demo.main(["--messages", "10", "--keys", "2", "--asyncio"]) == 1
    assert "result: FAILED" in capsys.readouterr().out


def test_bad_arguments() -> None:
    with pytest.raises(SystemExit) as info:
        demo.main(["--messages", "5", "--keys", "10"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        demo.main(["--messages", "0"])
