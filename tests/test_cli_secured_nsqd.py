"""The command line and the HTTP clients against a locked-down nsqd (TLS required with a
verified client certificate, AUTH through an auth server, HTTPS beside the plain HTTP API:
tests/real_upgrades_support.py's ``LOCKED``), as operators run them: ``smartnsq publish``
and ``smartnsq tail ... | head`` with the TLS options and the secret in
``SMARTNSQ_AUTH_SECRET``, a wrong secret, ``stat`` and ``topic create`` over HTTPS, and
``HttpProducer`` (its ``config.connection.tls``).

The TCP tests run on the double and on the real stock nsqd 1.3.0; HTTPS only on the real one
(the double serves no HTTPS). The ``real`` variants run under ``make test-real`` (which sets
``SMARTNSQ_REAL_NSQD``): this module starts its own real nsqd (ports 5300–5383) and stops it
at the end.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from smartnsq.config import ConnectionConfig, ProducerConfig, TLSConfig
from smartnsq.errors import ConfigError, NSQError
from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.producer import HttpProducer
from tests.cli_support import ClusterThread, invoke, sh
from tests.real_servers import REAL_NSQD, unique
from tests.real_upgrades_support import LOCKED, AuthServer, Certs, RealServers

pytestmark = pytest.mark.real_nsqd

#: how long a refused command may take to end (AUTH is refused at once)
PROMPT = 10.0
WRONG = "wr0ng-s3cret-h68"
CLI = f"{shlex.quote(sys.executable)} -m smartnsq"




@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, certs: Certs,
         auth_server: AuthServer) -> Iterator[RealServers]:
    servers = RealServers(certs, auth_server, tmp_path_factory.mktemp("realnsq"),
                          port_bases=range(5300, 5384, 12))
    try:
        yield servers
    finally:
        servers.stop_all()


@dataclass
class Locked:
    kind: str
    tcp: str
    #: nsqd's HTTPS address (real only)
    https: str
    certs: Certs

    def tls_args(self, cert: bool = True) -> str:
        args = f"--tls-root-ca-file {shlex.quote(self.certs.ca_file)}"
        return args + (f" --tls-cert {shlex.quote(self.certs.client_pem)}" if cert else "")

    def tls(self, **kw: Any) -> TLSConfig:
        return TLSConfig(**{"enabled": True, "ca_file": self.certs.ca_file,
                            "cert_file": self.certs.client_pem,
                            "key_file": self.certs.client_pem, **kw})


def _real(request: pytest.FixtureRequest, certs: Certs) -> Locked:
    if not REAL_NSQD:
        pytest.skip("SMARTNSQ_REAL_NSQD is not set (real-server runs: `make test-real`)")
    servers: RealServers = request.getfixturevalue("real")
    srv = servers.get(LOCKED)
    return Locked("real", srv.tcp, srv.https, certs)


@pytest.fixture(scope="module", params=["double", "real"])
def locked(request: pytest.FixtureRequest, certs: Certs,
           auth_server: AuthServer) -> Iterator[Locked]:
    if request.param == "real":
        yield _real(request, certs)
        return
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock",
                       **LOCKED.double(certs, auth_server))
    try:
        yield Locked("double", ct.cluster.nsqd_tcp_addresses[0], "", certs)
    finally:
        ct.stop()


@pytest.fixture(scope="module")
def real_locked(request: pytest.FixtureRequest, certs: Certs) -> Locked:
    return _real(request, certs)


def test_tail_pipe_reads_what_publish_sent_over_tls_and_auth(locked: Locked) -> None:
    topic = unique("cli_tls")
    sent = [f"m{i}" for i in range(8)]
    pub = sh(f"export SMARTNSQ_AUTH_SECRET=good; printf '%s\\n' {' '.join(sent)} | "
             f"{CLI} publish {topic} --nsqd {locked.tcp} {locked.tls_args()} --deflate")
    assert pub.returncode == 0, pub.stderr.decode()
    assert b"published 8 message(s)" in pub.stderr
    began = time.monotonic()
    r = sh(f"export SMARTNSQ_AUTH_SECRET=good; {CLI} tail {topic} --nsqd {locked.tcp} "
           f"--channel c {locked.tls_args()} --snappy | head -n 5")
    got = r.stdout.decode().splitlines()
    assert r.returncode == 0, r.stderr.decode()
    assert len(got) == 5 and set(got) <= set(sent), got
    assert b"Traceback" not in r.stderr and time.monotonic() - began < PROMPT


def test_without_tls_or_with_a_wrong_secret_the_commands_fail_clearly(locked: Locked) -> None:
    topic = unique("cli_tls_no")
    cases = [
        # the secret on the command line, the other by the environment
        (f"printf 'x\\n' | {CLI} publish {topic} --nsqd {locked.tcp} {locked.tls_args()} "
         f"--auth-secret {WRONG}", "AUTH"),
        (f"export SMARTNSQ_AUTH_SECRET={WRONG}; {CLI} tail {topic} --nsqd {locked.tcp} "
         f"{locked.tls_args()} --connect-timeout 3 | head -n 1", "AUTH"),
        (f"export SMARTNSQ_AUTH_SECRET=good; printf 'x\\n' | {CLI} publish {topic} "
         f"--nsqd {locked.tcp}", "TLS"),
        (f"export SMARTNSQ_AUTH_SECRET=good; printf 'x\\n' | {CLI} publish {topic} "
         f"--nsqd {locked.tcp} {locked.tls_args(cert=False)}", "certificate"),
    ]
    for script, word in cases:
        began = time.monotonic()
        r = sh(script)
        took = time.monotonic() - began
        err = r.stderr.decode()
        assert r.returncode == 1, (script, err)
        assert took < PROMPT, (script, took)
        assert word in err and "Traceback" not in err, (script, err)
        assert WRONG not in err and WRONG not in r.stdout.decode(), err


@pytest.mark.parametrize(("args", "option"), [
    (["tail", "t", "--nsqd", "127.0.0.1:4150", "--snappy", "--deflate"], "--deflate"),
    (["publish", "t", "--nsqd", "127.0.0.1:4150", "--tls-root-ca-file", "/nonexistent/ca.pem"],
     "--tls-root-ca-file"),
    (["to-file", "t", "--nsqd", "127.0.0.1:4150", "--output-dir", "/tmp", "--tls-key",
      __file__], "--tls-cert"),
    (["tail", "t", "--nsqd", "127.0.0.1:4150", "--deflate-level", "3"], "--deflate"),
    (["tail", "t", "--nsqd", "127.0.0.1:4150", "--tls-cert", __file__], "--tls-cert"),
    (["bridge", "t", "--from-nsqd", "127.0.0.1:4150", "--to-nsqd", "127.0.0.1:4152",
      "--to-snappy", "--to-deflate"], "--to-deflate"),
    (["stat", "--nsqd", "127.0.0.1:4151", "--tls"], "https://"),
    (["topic", "create", "t", "--lookupd", "127.0.0.1:4161", "--tls"], "https://"),
])
def test_wrong_combinations_are_usage_errors_naming_the_option(args: list[str],
                                                                 option: str) -> None:
    result = invoke(args)
    assert result.exit_code == 2, result.output
    assert option in result.output and "Traceback" not in result.output, result.output
    assert "No such option" not in result.output, result.output


def test_the_secret_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMARTNSQ_AUTH_SECRET", WRONG)
    for args in (["tail", "--help"], ["tail", "t", "--nsqd", "127.0.0.1:4150", "--snappy",
                                      "--deflate"]):
        result = invoke(args)
        assert WRONG not in result.output
    assert "SMARTNSQ_AUTH_SECRET" in invoke(["publish", "--help"]).output


def test_stat_and_topic_create_over_https_with_a_client_certificate(
        real_locked: Locked) -> None:
    t = real_locked
    topic = unique("cli_https")
    r = sh(f"{CLI} topic create {topic} --nsqd {t.https} {t.tls_args()}")
    assert r.returncode == 0, r.stderr.decode()
    assert f"nsqd {t.https}: OK" in r.stdout.decode()
    r = sh(f"{CLI} stat {topic} --nsqd {t.https} {t.tls_args()} --once --json")
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert [x["topic"] for x in doc["topics"]] == [topic]
    # nsqd asks HTTPS clients for a certificate too; without one: one line, exit 1
    r = sh(f"{CLI} stat --nsqd {t.https} {t.tls_args(cert=False)} --once")
    assert r.returncode == 1 and b"CERTIFICATE" in r.stderr.upper(), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


async def test_http_producer_and_client_verify_https_with_the_tls_config(
        real_locked: Locked) -> None:
    t = real_locked
    topic = unique("http_tls")
    async with HttpProducer(nsqd=[t.https], config=tls_config(t.tls())) as p:
        await p.publish(topic, b"one", timeout=5.0)
        await p.publish_many(topic, [b"two", b"three"], timeout=5.0)
    async with NsqdHttpClient(tls=t.tls()) as http:
        stats = await http.stats(t.https, topic)
    assert [x["message_count"] for x in stats["topics"]] == [3]
    # the system's CAs do not know the test CA: refused, not published
    async with HttpProducer(nsqd=[t.https]) as p:
        with pytest.raises(NSQError, match="certificate"):
            await p.publish(topic, b"never", timeout=2.0)


def tls_config(tls: TLSConfig) -> ProducerConfig:
    return ProducerConfig(connection=ConnectionConfig(tls=tls))


def test_http_producer_refuses_tls_it_could_not_use(certs: Certs) -> None:
    config = tls_config(TLSConfig(enabled=True, ca_file=certs.ca_file))
    with pytest.raises(ConfigError, match=r"config\.connection\.tls .*https://"):
        HttpProducer(nsqd=["127.0.0.1:4151"], config=config)
    with pytest.raises(ConfigError, match="https://"):
        HttpProducer(lookupd=["127.0.0.1:4161"], config=config)
    with pytest.raises(ConfigError, match=r"tls\.ca_file"):
        HttpProducer(nsqd=["https://127.0.0.1:4152"],
                     config=tls_config(TLSConfig(enabled=True, ca_file=certs.server_key)))
    # one dialect: TLS is given where the TCP producer takes it, not beside it
    stray: Any = {"tls": config.connection.tls}
    with pytest.raises(TypeError, match="tls"):
        HttpProducer(nsqd=["https://127.0.0.1:4152"], **stray)
