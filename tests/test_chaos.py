"""The chaos soak harness (benchmarks/chaos.py) on a short run, so that it cannot rot.

The full soak is a benchmark (``make chaos``); here it runs ~18 s at a low rate against the
embedded cluster with every fault kind once, and must report nothing lost and nothing
reordered. The bookkeeping, schedule and argument checks are tested on their own.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import chaos
from chaos import FAULT_KINDS, Histogram, Ledger, SoakConfig, SoakError, make_schedule

pytestmark = pytest.mark.chaos

#: a seed whose short schedule holds every fault kind (checked below)
SHORT = SoakConfig(seconds=18.0, rate=200.0, seed=3, keys=40, fault_every=2.0, drain=40.0,
                   warmup=4.0, status_every=3.0, mem_bound_mb=64.0)


async def test_short_soak_every_fault_nothing_lost_nothing_reordered() -> None:
    lines: list[str] = []
    result = await chaos.run_soak(SHORT, lines.append)
    report = chaos.render(result)
    assert result.ok, report
    ordered, plain = result.ledgers
    for lg in (ordered, plain):
        assert lg.acked > 0, report
        assert lg.missing() == 0, report
        # every acknowledged message was consumed (failed publishes stored anyway add to it)
        assert lg.consumed >= lg.acked, report
        assert lg.unexpected == 0, report
    assert ordered.reorders == 0, report
    assert result.drained, report
    # each scheduled fault was applied (and the lasting ones healed), none refused
    assert {f.kind for f in result.schedule} == set(FAULT_KINDS)
    assert result.faults_refused == 0, report
    texts = [t for _, t in result.events]
    for start, end in (("node kill", "node back"), ("lookupd down", "lookupd back"),
                       ("slow node", "at full speed again"), ("consumer stopped",
                                                               "consumer started again"),
                       ("handler fails", "handler healthy again")):
        assert any(start in t for t in texts) and any(end in t for t in texts), texts
    assert any(t.startswith("leader move") for t in texts), texts
    assert any(t.startswith("dropped connections") for t in texts), texts
    # the clients were closed: every task of the run ended
    assert result.tasks_end == result.tasks_start, report
    assert "result: OK" in report
    assert "failed publishes by fault window" in report
    assert any(line.startswith("fault schedule (seed 3") for line in lines)
    assert any(line.startswith("t+") and "acked" in line for line in lines), lines


def test_schedule_is_a_function_of_the_settings() -> None:
    a = make_schedule(SHORT)
    assert a == make_schedule(SHORT)
    other = make_schedule(SoakConfig(seconds=18.0, seed=4, fault_every=2.0))
    assert [(f.at, f.kind) for f in a] != [(f.at, f.kind) for f in other]
    assert all(f.at > 0 and f.at + f.duration <= SHORT.seconds for f in a)
    assert [f.at for f in a] == sorted(f.at for f in a)
    only = make_schedule(SoakConfig(seconds=600.0, faults=("leader_move", "drop_conns")))
    assert {f.kind for f in only} == {"leader_move", "drop_conns"}
    assert all(f.topic == "ordered" for f in only if f.kind == "leader_move")


def test_real_node_kills_stay_down_past_fail_over() -> None:
    sched = make_schedule(SoakConfig(seconds=600.0, real=True, faults=("node_kill",)))
    kills = [f for f in sched if f.kind == "node_kill"]
    assert kills and all(f.duration >= 40 for f in kills)
    # one that would not fit before the end becomes a dropped connection
    assert all(f.kind == "drop_conns" and f.at + 60 > 600.0 - 5.0
               for f in sched if f.kind != "node_kill")


def test_ledger_counts_loss_duplicates_and_reorderings() -> None:
    lg = Ledger.of("ordered", True, keys=2)
    lg.books[0].next_seq = 5
    for seq in range(4):
        lg.ack(0, seq, now=100.0 + seq)
    lg.consume(b"0:0")
    lg.consume(b"0:2")
    lg.consume(b"0:1")          # first delivery below the key's highest: a reordering
    lg.consume(b"0:2")          # a repeat below nothing new: a duplicate
    lg.consume(b"0:1")          # a repeat below the highest: a duplicate and a replay
    assert (lg.consumed, lg.duplicates, lg.rewinds, lg.reorders) == (3, 2, 1, 1)
    assert lg.reorder_examples == ["key 0: seq 1 after 2"]
    assert lg.missing() == 1 and lg.lag(110.0) == (1, 7.0)
    assert lg.missing_examples(100.0) == ["0:3 acked at t+3.0s"]
    # consumed before its acknowledgement came back: not missing once acked
    lg.consume(b"0:4")
    lg.ack(0, 4, now=200.0)
    assert lg.missing() == 1
    # a failed publish whose message was stored anyway
    lg.books[1].next_seq = 3
    lg.fail(1, 0)
    lg.consume(b"1:0")
    assert lg.failed_but_stored == 1 and lg.duplicates == 2 and lg.failed_late == 0
    # ... and one stored behind its key's successor: not a reordering of acknowledged ones
    lg.fail(1, 1)
    lg.ack(1, 2, now=300.0)
    lg.consume(b"1:2")
    lg.consume(b"1:1")
    assert (lg.failed_but_stored, lg.failed_late, lg.reorders) == (2, 1, 1)
    # bodies that no publisher sent
    for body in (b"junk", b"0:99", b"7:0", b"0:-1", b"0:1:2"):
        lg.consume(body)
    assert lg.unexpected == 5


def test_failures_are_attributed_to_the_latest_covering_fault() -> None:
    from collections import Counter

    sched = [chaos.Fault(10.0, "leader_move", 0.0), chaos.Fault(15.0, "node_kill", 5.0)]
    r = chaos.SoakResult(
        cfg=SHORT, target="embedded", schedule=sched, events=[], ledgers=[], scheduled=0,
        issued=0, behind=0, fail_reasons=Counter(), latency=Histogram(), lag_peak=0,
        lag_peak_age=0.0, rss_start=0, rss_warm=0, rss_peak=0, rss_end=0, fds_start=0,
        fds_end=0, tasks_start=0, tasks_end=0, consumer_errors=[], load_seconds=0.0,
        drain_seconds=0.0, drained=True, server_note="", faults_refused=0,
        fail_times=Counter({3: 7, 12: 2, 16: 5, 40: 1}))
    by_kind, outside = chaos.failures_by_fault(r)
    # second 16 is inside both windows: the node kill, started later, takes it
    assert by_kind == {"leader_move": (1, 2), "node_kill": (1, 5)}
    assert outside == 8


def test_histogram_quantiles() -> None:
    h = Histogram()
    assert h.quantile(0.5) == 0.0
    for ms in range(1, 101):
        h.add(ms / 1000)
    assert math.isclose(h.quantile(0.5), 0.050, rel_tol=0.03)
    assert math.isclose(h.quantile(0.99), 0.099, rel_tol=0.03)
    assert h.max == 0.1 and h.count == 100
    h.add(0.0)
    assert h.count == 101


@pytest.mark.parametrize(("kwargs", "names"), [
    ({"rate": 0}, "rate"),
    ({"rate": -5.0}, "rate"),
    ({"seconds": math.nan}, "seconds"),
    ({"seconds": math.inf}, "seconds"),
    ({"fault_every": 0}, "fault_every"),
    ({"mem_bound_mb": True}, "mem_bound_mb"),
    ({"status_every": "5"}, "status_every"),
    ({"keys": 0}, "keys"),
    ({"keys": 2.5}, "keys"),
    ({"batch": True}, "batch"),
    ({"max_outstanding": 0}, "max_outstanding"),
    ({"seed": "x"}, "seed"),
    ({"seed": False}, "seed"),
    ({"drain": -1.0}, "drain"),
    ({"warmup": 0}, "warmup"),
    ({"warmup": 30.0, "seconds": 30.0}, "warmup"),
    ({"faults": ("leader_move", "meteor")}, "meteor"),
    ({"plain": (2, 2)}, "plain"),
    ({"plain": (0, 1)}, "plain"),
    ({"plain": (True, 1)}, "plain"),
])
def test_bad_settings_are_refused_by_name(kwargs: dict[str, object], names: str) -> None:
    with pytest.raises(SoakError, match=names):
        SoakConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("argv", "names"), [
    (["--rate", "0"], "rate"),
    (["--minutes", "-1"], "seconds"),
    (["--seconds", "nan"], "seconds"),
    (["--keys", "0"], "keys"),
    (["--faults", "leader_move,bogus"], "bogus"),
    (["--rate", "fast"], "--rate"),
    (["--plain", "3"], "--plain"),
    (["--plain", "2x2"], "plain"),
])
def test_bad_command_lines_exit_2_naming_the_option(
        argv: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        chaos.parse_args(argv)
    assert exc.value.code == 2
    assert names in capsys.readouterr().err


def test_schedule_only_prints_the_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        chaos.parse_args(["--schedule-only", "--seconds", "18", "--fault-every", "2",
                          "--seed", "3"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fault schedule (seed 3")
    assert len(out) == 1 + len(make_schedule(SHORT))


def test_missing_real_cluster_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv("REALNSQ_STATE", str(tmp_path))
    target = chaos.RealTarget(3)
    with pytest.raises(chaos.TargetError, match="no pid recorded"):
        target._pid("youzan-nsqd0")
