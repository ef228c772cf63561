"""``smartnsq stat`` lists topics in natural order, the way an operator numbers them (t1, t2,
t10, t100; as text t10 and t100 would come before t2), in the table and in ``--json``, and a
topic's partitions by number (0, 1, 2, ..., 10, 11)."""

from __future__ import annotations

import json

from tests.cli_support import ClusterThread, cluster_fixture, invoke

stock = cluster_fixture("stock", nodes=1)
yz = cluster_fixture("youzan", nodes=1)

NAMES = ["t100", "t2", "t10", "t1", "a9b10", "a9b2"]
#: every run of digits as a number: a9b2 before a9b10 too
WANT = ["a9b2", "a9b10", "t1", "t2", "t10", "t100"]


def make(ct: ClusterThread, name: str, partitions: int | None = None) -> None:
    if partitions is None:
        ct.call(lambda: ct.cluster.create_topic(name, channels=["c"]))
    else:
        ct.call(lambda: ct.cluster.create_topic(name, partitions, 1, multi_part=True,
                                                channels=["c"]))


def _column(table: str, names: list[str]) -> list[str]:
    """The names in the order the table shows them (first cell of each row that has one)."""
    shown = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").split("│")]
        first = next((c for c in cells if c), "")
        if first in names:
            shown.append(first)
    return shown


def test_stat_lists_topics_in_natural_order(stock: ClusterThread) -> None:
    for name in NAMES:
        make(stock, name)
    nsqd = stock.cluster.nsqd_http_addresses[0]
    r = invoke(["stat", "--nsqd", nsqd, "--once", "--json"])
    assert r.exit_code == 0, r.output
    assert [t["topic"] for t in json.loads(r.stdout)["topics"]] == WANT
    r = invoke(["stat", "--nsqd", nsqd, "--once", "--interval", "0.1"])
    assert r.exit_code == 0, r.output
    assert _column(r.stdout, NAMES) == WANT, r.stdout


def test_stat_lists_partitions_by_number(yz: ClusterThread) -> None:
    for name in ("p10", "p9"):
        make(yz, name, 12)
    r = invoke(["stat", "--lookupd", yz.lookupd, "--once", "--json"])
    assert r.exit_code == 0, r.output
    rows = [(t["topic"], t["partition"]) for t in json.loads(r.stdout)["topics"]]
    assert rows == [(n, p) for n in ("p9", "p10") for p in range(12)]
