"""The nsq sink and source through local Spark against a locked-down nsqd (TLS required with
a verified client certificate, AUTH through an auth server: tests/real_upgrades_support.py's
``LOCKED``): rows written by the sink read back by a batch read and by an availableNow
stream, a wrong secret failing the job naming AUTH without showing the secret, and no secret
in the query plans or the stream's progress.

Stock on the double and on the real stock nsqd 1.3.0 (``real``: under ``make test-real``,
which sets ``SMARTNSQ_REAL_NSQD``; this module starts its own real nsqd on ports 5800–5889
and stops it at the end); youzan on the double (its source also calls nsqd's plain HTTP API,
which ``--tls-required=tcp-https`` leaves open).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.real_servers import REAL_NSQD, unique
from tests.real_upgrades_support import LOCKED, AuthServer, Certs, RealServers
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

pytestmark = pytest.mark.real_nsqd

WRONG = "wr0ng-s3cret-h71"
#: the auth server's secret for these tests (tests/real_upgrades_support.py's SECRETS)
GOOD = "spark-s3cret-h71"
WAIT = 120.0




@dataclass
class Secured:
    kind: str
    lookupd: str
    nsqd: str
    certs: Certs

    def wire(self, secret: str = GOOD) -> dict[str, str]:
        return {"tlsRootCaFile": self.certs.ca_file, "tlsCert": self.certs.client_pem,
                "authSecret": secret}


def _double(certs: Certs, auth: AuthServer, flavour: str, nodes: int) -> ThreadedCluster:
    return ThreadedCluster(nodes=nodes, flavour=flavour, **LOCKED.double(certs, auth))


@pytest.fixture(scope="module", params=["double", "real"])
def stock(request: pytest.FixtureRequest, certs: Certs, auth_server: AuthServer,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    if request.param == "real":
        if not REAL_NSQD:
            pytest.skip("SMARTNSQ_REAL_NSQD is not set (real-server runs: `make test-real`)")
        servers = RealServers(certs, auth_server, tmp_path_factory.mktemp("realnsq"),
                              port_bases=range(5800, 5890, 12))
        try:
            srv = servers.get(LOCKED)
            yield Secured("real", srv.lookupd, srv.tcp, certs)
        finally:
            servers.stop_all()
        return
    tc = _double(certs, auth_server, "stock", 1)
    try:
        yield Secured("double", tc.cluster.lookupd_http_addresses[0],
                      tc.cluster.nsqd_tcp_addresses[0], certs)
    finally:
        tc.close()


@pytest.fixture(scope="module")
def youzan(certs: Certs, auth_server: AuthServer) -> Iterator[tuple[ThreadedCluster, Secured]]:
    tc = _double(certs, auth_server, "youzan", 2)
    try:
        yield tc, Secured("double", tc.cluster.lookupd_http_addresses[0], "", certs)
    finally:
        tc.close()


def rows(spark: Any, prefix: str, n: int) -> Any:
    return spark.createDataFrame([(f"{prefix}{i}".encode(),) for i in range(n)], "value binary")


def plan_text(df: Any) -> str:
    return str(df._jdf.queryExecution().toString())


def error_text(exc: BaseException) -> str:
    return f"{exc}\n{getattr(exc, 'desc', '')}"


def run_available_now(spark: Any, options: dict[str, str], out: Path) -> tuple[list[bytes],
                                                                                str]:
    """An availableNow stream into parquet: its bodies, and its plan and progress as text."""
    df = spark.readStream.format("nsq").options(**options).load()
    seen = plan_text(df)
    q = (df.select("body").writeStream.format("parquet").option("path", str(out / "data"))
         .option("checkpointLocation", str(out / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(WAIT), "availableNow query did not finish"
    assert q.exception() is None, q.exception()
    seen += json.dumps(q.recentProgress, default=str)
    got = [bytes(r.body) for r in spark.read.parquet(str(out / "data")).collect()]
    return got, seen


def test_stock_round_trip_over_tls_and_auth(spark: Any, stock: Secured, tmp_path: Path) -> None:
    topic = unique("spark_tls")
    rows(spark, "a", 20).write.format("nsq").mode("append").options(
        nsqd=stock.nsqd, topic=topic, deflate="true", deflateLevel="3",
        **stock.wire()).save()
    base = {"lookupd": stock.lookupd, "topic": topic, "channel": "spark", "snappy": "true",
            **stock.wire()}
    df = spark.read.format("nsq").options(consume="true", maxMessages="20",
                                          maxWaitSeconds="20", **base).load()
    seen = plan_text(df)
    assert sorted(bytes(r.body) for r in df.select("body").collect()) == \
        sorted(f"a{i}".encode() for i in range(20))
    # the channel exists now: a stream takes what is written next
    rows(spark, "b", 10).write.format("nsq").mode("append").options(
        nsqd=stock.nsqd, topic=topic, **stock.wire()).save()
    got, more = run_available_now(spark, {**base, "maxWaitSeconds": "20"}, tmp_path)
    assert sorted(got) == sorted(f"b{i}".encode() for i in range(10))
    assert GOOD not in seen + more


def test_a_wrong_secret_fails_the_job_naming_auth(spark: Any, stock: Secured) -> None:
    topic = unique("spark_tls_no")
    with pytest.raises(Exception) as err:
        rows(spark, "x", 3).write.format("nsq").mode("append").options(
            nsqd=stock.nsqd, topic=topic, **stock.wire(WRONG)).save()
    text = error_text(err.value)
    assert "AUTH" in text and WRONG not in text, text[-3000:]
    # with the topic there, a read with the wrong secret fails too (it does not wait)
    rows(spark, "x", 3).write.format("nsq").mode("append").options(
        nsqd=stock.nsqd, topic=topic, **stock.wire()).save()
    with pytest.raises(Exception) as err:
        spark.read.format("nsq").options(
            lookupd=stock.lookupd, topic=topic, consume="true", maxWaitSeconds="10",
            **stock.wire(WRONG)).load().collect()
    text = error_text(err.value)
    assert "AUTH" in text and WRONG not in text, text[-3000:]


def test_youzan_round_trip_over_tls_and_auth(
        spark: Any, youzan: tuple[ThreadedCluster, Secured], tmp_path: Path) -> None:
    tc, target = youzan
    topic = "spark_tls_yz"
    tc.sync(tc.cluster.create_topic, topic, 2, channels=["keep"])
    rows(spark, "y", 40).write.format("nsq").mode("append").options(
        lookupd=target.lookupd, topic=topic, snappy="true", **target.wire()).save()
    base = {"lookupd": target.lookupd, "topic": topic, **target.wire()}
    df = spark.read.format("nsq").options(**base).load()
    seen = plan_text(df)
    want = sorted(f"y{i}".encode() for i in range(40))
    assert sorted(bytes(r.body) for r in df.select("body").collect()) == want
    got, more = run_available_now(spark, {**base, "startingOffsets": "earliest",
                                          "maxMessagesPerTrigger": "15"}, tmp_path)
    assert sorted(got) == want
    assert GOOD not in seen + more
    with pytest.raises(Exception) as err:
        spark.read.format("nsq").options(**{**base, **target.wire(WRONG)}).load().collect()
    text = error_text(err.value)
    assert "AUTH" in text and WRONG not in text, text[-3000:]
