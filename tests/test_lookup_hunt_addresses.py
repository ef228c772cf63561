"""Hunt findings on the nsqd addresses lookupds hand out: what nsqd's --broadcast-address
may be set to, and what the clients then do (scripted lookupds on 127.0.0.1)."""

from __future__ import annotations

import json
import logging

import pytest

from smartnsq import Producer
from smartnsq.config import ProducerConfig
from smartnsq.errors import LookupRefusedError, PublishError
from smartnsq.lookup import Lookup
from smartnsq.lookup.parse import parse_listlookup, parse_lookup
from tests.lookup_fakes import V1_HEADERS, FakeLookupd, peer, quick_config

L = "http://127.0.0.1:4161"

BAD_HOSTS = [
    pytest.param("10.0.0.1:4150", id="host_and_port"),
    pytest.param("nsqd 1", id="space"),
    pytest.param("nsqd/1", id="slash"),
    pytest.param("fe80::1::2", id="bad_ipv6"),
]


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_a_broadcast_address_that_is_no_host_is_skipped_naming_it(
        host: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "smartnsq.lookup")
    doc = {"producers": [peer(4150, youzan=False), peer(4250, host=host, youzan=False)]}
    ans = parse_lookup(doc, lookupd=L, received_at=0.0, topic="t")
    # it was kept as "[10.0.0.1:4150]:4250", "nsqd 1:4250" ...: connects failed on a name
    # that no resolver knows, or a publish raised ConfigError about the caller's config
    assert [n.address for n in ans.legacy] == ["127.0.0.1:4150"]
    assert len(ans.skipped) == 1 and repr(host) in ans.skipped[0]


@pytest.mark.parametrize("host", ["::1", "[::1]", "nsqd-1.example.internal", "10.0.0.1"])
def test_hosts_and_ip_addresses_of_either_kind_are_used(host: str) -> None:
    doc = {"producers": [peer(4150, host=host, youzan=False)]}
    (node,) = parse_lookup(doc, lookupd=L, received_at=0.0, topic="t").legacy
    assert node.tcp_port == 4150


async def test_a_publish_through_a_lookupd_naming_only_bad_hosts_fails_naming_them(
        fakes: list[FakeLookupd]) -> None:
    fake = await FakeLookupd("stock").start()
    fakes.append(fake)
    body = {"channels": [], "producers": [peer(4150, host="nsqd 1", youzan=False)]}
    fake.raw["/lookup"] = (200, json.dumps(body).encode(), V1_HEADERS)
    async with Lookup(quick_config(fake.url)) as lk:
        with pytest.raises(LookupRefusedError, match="'nsqd 1'"):
            await lk.lookup("t", "w")
        producer = Producer(lookupd=lk, config=ProducerConfig(publish_timeout=2))
        await producer.start()
        try:
            # it was a ConfigError: "invalid address 'nsqd 1:4150'", as if the caller erred
            with pytest.raises(PublishError, match="'nsqd 1'"):
                await producer.publish("t", b"x")
        finally:
            await producer.stop()


@pytest.mark.parametrize("host", ["10.0.0.2:4161", "lookupd 2"])
def test_a_listed_lookupd_whose_node_ip_is_no_host_is_skipped(
        host: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "smartnsq.lookup")
    entry = {"ID": "x", "NodeIP": "10.0.0.1", "TcpPort": "4160", "HttpPort": "4161",
             "RpcPort": "4162", "Epoch": 1}
    doc = {"lookupdnodes": [entry, {**entry, "NodeIP": host}], "lookupdleader": entry}
    listed = parse_listlookup(doc, lookupd=L)
    # it was asked every round as "http://[10.0.0.2:4161]:4161" and demoted
    assert listed is not None and listed.lookupds == ("http://10.0.0.1:4161",)
    assert repr(host) in caplog.text
