"""Envelope decoding and payload parsing: docs/protocol.md §4.1/§4.3/§7.2 shapes, real captures."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import Flavour, LookupdError, LookupFailedError
from smartnsq.lookup.envelope import decode, error_message
from smartnsq.lookup.models import (
    ChannelsModel,
    LookupdInfo,
    NodesModel,
    TopicsModel,
)
from smartnsq.lookup.parse import (
    MAX_LISTED_LOOKUPDS,
    not_found_answer,
    not_found_reason,
    parse_listlookup,
    parse_lookup,
    validate,
)
from smartnsq.lookup.view import LookupAnswer, merge_answers
from tests.captures import CAPTURES

V1 = {"X-NSQ-Content-Type": "nsq; version=1.0"}
L = "http://127.0.0.1:4161"


def lookup_of(status: int, body: bytes, headers: dict[str, str]) -> LookupAnswer:
    """What the component does with one /lookup response."""
    try:
        payload = decode(status, headers, body, lookupd=L, path="/lookup")
    except LookupdError as exc:
        reason = not_found_reason(exc)
        if reason is None:
            raise
        return not_found_answer(reason, lookupd=L, received_at=1.0)
    return parse_lookup(payload, lookupd=L, received_at=1.0)


def addr(ans: LookupAnswer) -> dict[int, str]:
    return {p: n.address for p, n in ans.partitions.items()}


# -- envelopes (docs/protocol.md §4.1) -------------------------------------------------------------

def test_v1_payload_is_the_body() -> None:
    assert decode(200, V1, b'{"topics":["a"]}') == {"topics": ["a"]}


def test_v1_body_that_looks_like_a_wrapper_is_still_the_payload() -> None:
    doc = {"status_code": 200, "status_txt": "OK", "data": {"x": 1}}
    assert decode(200, V1, json.dumps(doc).encode()) == doc


def test_legacy_wrapper_yields_data_and_null_data_is_empty() -> None:
    assert decode(200, {}, b'{"status_code":200,"status_txt":"OK","data":{"a":1}}') == {"a": 1}
    assert decode(200, {}, b'{"status_code":200,"status_txt":"OK","data":null}') == {}


def test_empty_body_is_an_empty_object() -> None:
    assert decode(200, V1, b"") == {}
    assert decode(200, {}, b"  \n") == {}


def test_unwrapped_body_without_header_is_taken_as_payload() -> None:
    assert decode(200, {}, b'{"producers":[]}') == {"producers": []}


def test_non_200_carries_the_message() -> None:
    with pytest.raises(LookupdError) as ei:
        decode(404, V1, b'{"message":"TOPIC_NOT_FOUND"}', lookupd=L, path="/lookup")
    err = ei.value
    assert (err.status, err.reason, err.lookupd, err.path) == (
        404, "TOPIC_NOT_FOUND", L, "/lookup")
    assert "HTTP 404" in str(err) and L in str(err)
    assert isinstance(err, LookupFailedError)


def test_legacy_error_wrapper_keeps_status_txt() -> None:
    with pytest.raises(LookupdError) as ei:
        decode(500, {}, b'{"status_code":500,"status_txt":"TOPIC_NOT_FOUND","data":null}')
    assert (ei.value.status, ei.value.reason) == (500, "TOPIC_NOT_FOUND")


def test_wrapper_with_error_code_but_http_200_is_an_error() -> None:
    with pytest.raises(LookupdError) as ei:
        decode(200, {}, b'{"status_code":500,"status_txt":"boom","data":null}')
    assert (ei.value.status, ei.value.reason) == (500, "boom")


def test_youzan_unescaped_error_json_falls_back_to_raw_text() -> None:
    body = b'{"message":"topic "x" is bad"}'
    assert error_message(body) == body.decode()
    with pytest.raises(LookupdError) as ei:
        decode(400, V1, body)
    assert ei.value.reason == body.decode()


def test_malformed_json_on_200_is_rejected() -> None:
    with pytest.raises(LookupdError, match="malformed JSON"):
        decode(200, V1, b'{"producers": [')


def test_error_text_is_shortened() -> None:
    assert len(error_message(b"x" * 5000)) < 300


# -- /lookup shapes of docs/protocol.md §7.2.2 -----------------------------------------------------

STOCK_PEER = {"remote_address": "10.0.0.5:51234", "hostname": "nsqd-1",
              "broadcast_address": "10.0.0.5", "tcp_port": 4150, "http_port": 4151,
              "version": "1.3.0", "topology_zone": "", "topology_region": ""}


def test_stock_unwrapped_lookup() -> None:
    body = json.dumps({"channels": ["c"], "producers": [STOCK_PEER]}).encode()
    ans = lookup_of(200, body, V1)
    assert ans.partitions == {} and not ans.partitioned and ans.meta is None
    assert [n.address for n in ans.legacy] == ["10.0.0.5:4150"]
    node = ans.legacy[0]
    assert (node.http_port, node.hostname, node.version, node.distributed_id) == (
        4151, "nsqd-1", "1.3.0", "")
    assert node.http_address == "10.0.0.5:4151" and not node.is_youzan_ha
    assert ans.channels == ("c",)


def test_stock_legacy_wrapped_lookup_from_protocol_doc() -> None:
    body = (b'{"status_code": 200, "status_txt": "OK",\n "data": {"channels": ["c"], '
            b'"producers": [{"broadcast_address": "10.0.0.5", "tcp_port": 4150, '
            b'"...": "..."}]}}')
    ans = lookup_of(200, body, {})
    assert [n.address for n in ans.legacy] == ["10.0.0.5:4150"]
    assert ans.legacy[0].http_port == 0


def test_stock_legacy_error_is_topic_not_found() -> None:
    ans = lookup_of(500, b'{"status_code": 500, "status_txt": "TOPIC_NOT_FOUND", "data": null}',
                    {})
    assert ans.not_found == "TOPIC_NOT_FOUND"


def test_very_old_lookupd_address_field() -> None:
    body = b'{"channels":[],"producers":[{"address":"nsq-old","tcp_port":4150,"http_port":4151}]}'
    ans = lookup_of(200, body, V1)
    assert ans.legacy[0].address == "nsq-old:4150"
    assert ans.legacy[0].broadcast_address == "nsq-old"


def test_ipv6_broadcast_address_is_bracketed() -> None:
    body = b'{"producers":[{"broadcast_address":"::1","tcp_port":4150,"http_port":4151}]}'
    node = lookup_of(200, body, V1).legacy[0]
    assert node.address == "[::1]:4150" and node.http_address == "[::1]:4151"


YZ_PEER_5 = {"id": "10.0.0.5:40312", "remote_address": "10.0.0.5:40312", "hostname": "nsqd-5",
             "broadcast_address": "10.0.0.5", "tcp_port": 4150, "http_port": 4151,
             "version": "0.3.7-HA.1.13.0", "distributed_id": "10.0.0.5:4250:4150:1001"}
YZ_PEER_6 = {**YZ_PEER_5, "id": "10.0.0.6:40110", "remote_address": "10.0.0.6:40110",
             "hostname": "nsqd-6", "broadcast_address": "10.0.0.6",
             "distributed_id": "10.0.0.6:4250:4150:1002"}


def test_youzan_lookup_with_meta_from_protocol_doc() -> None:
    doc = {"channels": ["ch1"],
           "meta": {"partition_num": 2, "replica": 2, "extend_support": False,
                    "ordered": False, "multi_part": False,
                    "disable_channel_auto_create": False},
           "producers": [YZ_PEER_5, YZ_PEER_6],
           "partitions": {"0": YZ_PEER_5, "1": YZ_PEER_6}}
    ans = lookup_of(200, json.dumps(doc).encode(), V1)
    assert addr(ans) == {0: "10.0.0.5:4150", 1: "10.0.0.6:4150"}
    assert ans.legacy == () and ans.partitioned
    assert ans.meta is not None and (ans.meta.partition_num, ans.meta.replica) == (2, 2)
    assert ans.partitions[0].distributed_id == "10.0.0.5:4250:4150:1001"
    assert ans.partitions[0].is_youzan_ha


def test_youzan_node_leading_several_partitions_appears_once() -> None:
    doc = {"producers": [YZ_PEER_5], "partitions": {"0": YZ_PEER_5, "1": YZ_PEER_5}}
    ans = lookup_of(200, json.dumps(doc).encode(), V1)
    assert addr(ans) == {0: "10.0.0.5:4150", 1: "10.0.0.5:4150"} and ans.legacy == ()


def test_youzan_old_unpartitioned_node_is_legacy() -> None:
    old = {**STOCK_PEER, "broadcast_address": "10.0.0.9", "version": "0.3.7"}
    doc = {"producers": [YZ_PEER_5, old], "partitions": {"0": YZ_PEER_5}}
    ans = lookup_of(200, json.dumps(doc).encode(), V1)
    assert [n.address for n in ans.legacy] == ["10.0.0.9:4150"]


def test_null_producers_and_partitions_when_writes_are_disabled() -> None:
    ans = lookup_of(200, b'{"channels":["c"],"producers":null,"partitions":null}', V1)
    assert ans.partitions == {} and ans.legacy == () and ans.partitioned
    assert ans.not_found is None


def test_older_youzan_meta_with_three_keys() -> None:
    body = (b'{"channels":[],"meta":{"partition_num":1,"replica":1,"extend_support":true},'
            b'"producers":[],"partitions":{}}')
    meta = lookup_of(200, body, V1).meta
    assert meta is not None and meta.extend_support and not meta.ordered


def test_non_numeric_and_out_of_range_partition_ids_are_skipped(
        caplog: pytest.LogCaptureFixture) -> None:
    doc = {"producers": [YZ_PEER_5], "partitions": {"0": YZ_PEER_5, "x": YZ_PEER_6,
                                                     "-1": YZ_PEER_6, "5000": YZ_PEER_6}}
    ans = lookup_of(200, json.dumps(doc).encode(), V1)
    assert addr(ans) == {0: "10.0.0.5:4150"}
    assert caplog.text.count("skipping partition id") == 3


def test_youzan_access_w_unknown_topic_is_not_found_in_both_envelopes() -> None:
    assert lookup_of(404, b'{"message":"Key not found"}', V1).not_found == "Key not found"
    ans = lookup_of(500, b'{"status_code":500,"status_txt":"Key not found","data":null}', {})
    assert ans.not_found == "Key not found"


def test_topic_without_channel_is_not_found() -> None:
    body = b'{"message":"Topic has no channel, should init at least one for the new topic"}'
    assert lookup_of(404, body, V1).not_found is not None


@pytest.mark.parametrize(("status", "body"), [
    (404, b'{"message":"NOT_FOUND"}'),  # not /lookup at all: a wrong port or path
    (500, b'{"message":"INTERNAL_ERROR"}'),
    (400, b'{"message":"INVALID_ACCESS_MODE"}'),
    (502, b"<html>bad gateway</html>"),
])
def test_other_errors_are_failures(status: int, body: bytes) -> None:
    with pytest.raises(LookupdError) as ei:
        lookup_of(status, body, V1)
    assert ei.value.status == status


@pytest.mark.parametrize("doc", [
    {"producers": [{"broadcast_address": "h", "tcp_port": "4150"}]},
    {"producers": [{"broadcast_address": 127, "tcp_port": 4150}]},
    {"producers": [{"broadcast_address": "h", "tcp_port": 0}]},
    {"producers": [{"broadcast_address": "h", "tcp_port": True}]},
    {"producers": [{"broadcast_address": "h"}]},
    {"producers": [{"tcp_port": 4150}]},
    {"producers": {"broadcast_address": "h", "tcp_port": 4150}},
    {"partitions": ["0"]},
    {"meta": {"partition_num": "2"}},
    {"channels": "c"},
    ["not", "an", "object"],
    "text",
])
def test_wrong_types_reject_the_whole_answer(doc: Any) -> None:
    with pytest.raises(LookupdError) as ei:
        lookup_of(200, json.dumps(doc).encode(), V1)
    assert ei.value.status == 200


def test_unknown_keys_are_ignored() -> None:
    doc = {"channels": [], "producers": [{**STOCK_PEER, "future_key": {"x": [1]}}],
           "new_top_level": 5}
    assert len(lookup_of(200, json.dumps(doc).encode(), V1).legacy) == 1


# -- /listlookup (docs/protocol.md §7.2.1) ---------------------------------------------------------

LISTLOOKUP_DOC = {
    "lookupdnodes": [
        {"ID": "10.0.0.1:4161", "NodeIP": "10.0.0.1", "TcpPort": "4160", "HttpPort": "4161",
         "RpcPort": "4162", "Epoch": 3},
        {"ID": "10.0.0.2:4161", "NodeIP": "10.0.0.2", "TcpPort": "4160", "HttpPort": "4161",
         "RpcPort": "4162", "Epoch": 3},
    ],
    "lookupdleader": {"ID": "10.0.0.1:4161", "NodeIP": "10.0.0.1", "TcpPort": "4160",
                      "HttpPort": "4161", "RpcPort": "4162", "Epoch": 3},
}


def test_listlookup_from_protocol_doc() -> None:
    cl = parse_listlookup(decode(200, V1, json.dumps(LISTLOOKUP_DOC).encode()), lookupd=L)
    assert cl is not None
    assert cl.lookupds == ("http://10.0.0.1:4161", "http://10.0.0.2:4161")
    assert (cl.leader, cl.leader_epoch) == ("http://10.0.0.1:4161", 3)


@pytest.mark.parametrize(("headers", "body"), [(V1, b""), ({}, b'{"status_code":200,'
                                                              b'"status_txt":"OK","data":null}')])
def test_standalone_youzan_listlookup_is_unsupported(headers: dict[str, str],
                                                     body: bytes) -> None:
    assert parse_listlookup(decode(200, headers, body), lookupd=L) is None


def test_listlookup_ports_must_be_strings() -> None:
    doc = {"lookupdnodes": [{**LISTLOOKUP_DOC["lookupdnodes"][0], "HttpPort": 4161}]}
    with pytest.raises(LookupdError, match="unexpected payload shape"):
        parse_listlookup(doc, lookupd=L)


def test_listlookup_skips_unusable_entries_and_zero_leader(
        caplog: pytest.LogCaptureFixture) -> None:
    doc = {"lookupdnodes": [{"ID": "a", "NodeIP": "", "HttpPort": "4161"},
                            {"ID": "b", "NodeIP": "10.0.0.3", "HttpPort": "http"},
                            {"ID": "c", "NodeIP": "10.0.0.4", "HttpPort": "99999"},
                            {"ID": "d", "NodeIP": "10.0.0.5", "HttpPort": "4161"}],
           "lookupdleader": {"ID": "", "NodeIP": "", "TcpPort": "", "HttpPort": "",
                             "RpcPort": "", "Epoch": 0}}
    cl = parse_listlookup(doc, lookupd=L)
    assert cl is not None and cl.lookupds == ("http://10.0.0.5:4161",) and cl.leader is None
    assert caplog.text.count("skipping /listlookup entry") == 3


def test_listlookup_leader_missing_from_list_is_added() -> None:
    doc = {"lookupdnodes": [], "lookupdleader": LISTLOOKUP_DOC["lookupdleader"]}
    cl = parse_listlookup(doc, lookupd=L)
    assert cl is not None and cl.lookupds == ("http://10.0.0.1:4161",)


# -- other read endpoints (docs/protocol.md §4.3, §7.2.3) ------------------------------------------

def test_topics_with_youzan_meta_info() -> None:
    doc = {"topics": ["a", "b"], "meta_info": [
        {"topic_name": "a", "extend_support": True, "ordered": False, "multi_part": False,
         "disable_channel_auto_create": False, "registered_channels": None}]}
    m = validate(TopicsModel, doc, lookupd=L, path="/topics")
    assert m.topics == ["a", "b"] and m.meta_info is not None and m.meta_info[0].extend_support


def test_youzan_nodes_with_partitions_and_info_with_ha_support() -> None:
    doc = {"producers": [{"remote_address": "1.2.3.4:5", "hostname": "h",
                          "broadcast_address": "1.2.3.4", "tcp_port": 4150, "http_port": 4151,
                          "version": "0.3.7-HA.1.13.0", "tombstones": [False],
                          "topics": ["t"], "partitions": {"t": ["0", "3"]}}]}
    node = validate(NodesModel, doc, lookupd=L, path="/nodes").producers[0]  # type: ignore[index]
    assert node.partitions == {"t": ["0", "3"]} and node.tcp_address == "1.2.3.4:4150"
    info = validate(LookupdInfo, {"version": "0.3.7-HA.1.13.0", "ha_support": True},
                    lookupd=L, path="/info")
    assert info.ha_support is True
    assert validate(ChannelsModel, {"channels": None}, lookupd=L, path="/channels").channels \
        is None


# -- real captures (docs/protocol.md §13.1) -------------------------------------------------------

def capture(flavour: str, name: str) -> tuple[int, bytes, dict[str, str]]:
    """(status, raw body bytes, headers) of a recorded response.

    The recordings keep the status but not the headers; the V1 header is what the server
    sends with the Accept header (all ``*.v1`` files and every stock response).
    """
    meta = json.loads((CAPTURES / flavour / f"{name}.json").read_text())
    body = (CAPTURES / flavour / f"{name}.raw.txt").read_bytes()
    headers = {} if name.endswith(".legacy") else V1
    return meta["_http_status"], body, headers


def decode_capture(flavour: str, name: str) -> object:
    status, body, headers = capture(flavour, name)
    return decode(status, headers, body)


needs_captures = pytest.mark.skipif(not CAPTURES.is_dir(), reason="no ../shared/captures")

BOTH = ("v1", "legacy")


def yz_lookup(name: str) -> LookupAnswer:
    return lookup_of(*capture("youzan", name))


@needs_captures
@pytest.mark.parametrize("env", BOTH)
def test_capture_youzan_lookup_w_metainfo(env: str) -> None:
    ans = yz_lookup(f"lookup_w_metainfo.{env}")
    assert addr(ans) == {0: "127.0.0.1:15250", 1: "127.0.0.1:15150"}
    assert ans.legacy == () and ans.partitioned
    assert ans.meta is not None
    assert (ans.meta.partition_num, ans.meta.replica, ans.meta.ordered,
            ans.meta.extend_support, ans.meta.multi_part,
            ans.meta.disable_channel_auto_create) == (2, 1, False, False, False, False)
    assert ans.partitions[0].distributed_id == "127.0.0.1:15252:15250:2"
    assert ans.partitions[1].http_port == 15151 and ans.partitions[1].hostname == "vm"
    view = merge_answers("yz_smoke_62263", "w", [ans], leader=None, built_at=0.0)
    assert view.partition_num == 2 and view.complete and view.flavour is Flavour.YOUZAN
    assert [(t.node.address, t.partition) for t in view.targets()] == [
        ("127.0.0.1:15250", 0), ("127.0.0.1:15150", 1)]


@needs_captures
@pytest.mark.parametrize("name", ["lookup_r", "lookup_noaccess"])
@pytest.mark.parametrize("env", BOTH)
def test_capture_youzan_lookup_r(name: str, env: str) -> None:
    ans = yz_lookup(f"{name}.{env}")
    assert addr(ans) == {0: "127.0.0.1:15250", 1: "127.0.0.1:15150"}
    assert ans.meta is None and ans.legacy == () and ans.channels == ()


@needs_captures
@pytest.mark.parametrize("env", BOTH)
def test_capture_youzan_ordered_topic(env: str) -> None:
    ans = yz_lookup(f"lookup_ordered_w_metainfo.{env}")
    assert ans.meta is not None and ans.meta.ordered and ans.meta.partition_num == 2
    assert addr(ans) == {0: "127.0.0.1:15150", 1: "127.0.0.1:15250"}
    after = yz_lookup(f"lookup_ordered_w_after_sub.{env}")
    assert after.channels == ("smoke_ch",) and after.meta is None


@needs_captures
@pytest.mark.parametrize("env", BOTH)
def test_capture_youzan_replicated_and_ext_topics(env: str) -> None:
    rep = yz_lookup(f"lookup_replicated_r_metainfo.{env}")
    assert rep.meta is not None and (rep.meta.partition_num, rep.meta.replica) == (1, 2)
    # the follower replica is not listed anywhere: only leaders are
    assert addr(rep) == {0: "127.0.0.1:15250"} and rep.legacy == ()
    ext = yz_lookup(f"lookup_ext_w_metainfo.{env}")
    assert ext.meta is not None and ext.meta.extend_support
    assert addr(ext) == {0: "127.0.0.1:15150"}


@needs_captures
@pytest.mark.parametrize("env", BOTH)
def test_capture_youzan_single_partition_and_channels(env: str) -> None:
    assert addr(yz_lookup(f"lookup_w_partition1.{env}")) == {1: "127.0.0.1:15150"}
    subbed = yz_lookup(f"lookup_r_metainfo_after_sub.{env}")
    assert subbed.channels == ("smoke_ch", "smoke_ch_adv")


@needs_captures
@pytest.mark.parametrize("env", BOTH)
def test_capture_youzan_missing_topic(env: str) -> None:
    r = yz_lookup(f"lookup_missing_topic_r.{env}")
    assert r.not_found is None and r.partitions == {} and r.legacy == () and r.partitioned
    w = yz_lookup(f"lookup_missing_topic_w.{env}")
    assert w.not_found == "Key not found"
    view = merge_answers("does_not_exist_62263", "w", [w], leader=None, built_at=0.0)
    assert view.not_found and view.empty and view.not_found_reason == "Key not found"


@needs_captures
@pytest.mark.parametrize("env", BOTH)
def test_capture_youzan_listlookup(env: str) -> None:
    cl = parse_listlookup(decode_capture("youzan", f"listlookup.{env}"), lookupd=L)
    assert cl is not None
    assert cl.lookupds == ("http://127.0.0.1:14161",)
    assert (cl.leader, cl.leader_epoch) == ("http://127.0.0.1:14161", 0)


@needs_captures
@pytest.mark.parametrize("env", BOTH)
def test_capture_youzan_nodes_and_topics(env: str) -> None:
    nodes = validate(NodesModel, decode_capture("youzan", f"lookupd_nodes.{env}"),
                     lookupd=L, path="/nodes").producers
    assert nodes is not None
    assert sorted(n.tcp_address for n in nodes) == ["127.0.0.1:15150", "127.0.0.1:15250"]
    assert all(n.partitions == {} and n.topics == [] for n in nodes)
    topics = validate(TopicsModel, decode_capture("youzan", f"lookupd_topics.{env}"),
                      lookupd=L, path="/topics").topics
    assert sorted(topics or []) == ["yz_ext_62263", "yz_ord_62263", "yz_rep_62263",
                                    "yz_smoke_62263"]


@needs_captures
def test_capture_stock_lookup_and_missing_topic() -> None:
    ans = lookup_of(*capture("stock", "lookupd_lookup"))
    assert [n.address for n in ans.legacy] == ["127.0.0.1:4150"]
    assert ans.partitions == {} and not ans.partitioned and ans.channels == ("smoke_ch",)
    view = merge_answers("smoke_stock_1795262248", "r", [ans], leader=None, built_at=0.0)
    assert view.flavour is Flavour.STOCK and view.partition_num == 0 and view.complete
    assert [(t.node.address, t.partition) for t in view.targets()] == [("127.0.0.1:4150", -1)]
    missing = lookup_of(*capture("stock", "lookupd_lookup_missing_topic"))
    assert missing.not_found == "TOPIC_NOT_FOUND"


@needs_captures
def test_capture_stock_nodes_and_info() -> None:
    nodes = validate(NodesModel, decode_capture("stock", "lookupd_nodes"),
                     lookupd=L, path="/nodes").producers
    assert nodes is not None and len(nodes) == 1
    assert nodes[0].topics == ["smoke_stock_1795262248"] and nodes[0].tombstones == [False]
    assert nodes[0].partitions is None
    info = validate(LookupdInfo, decode_capture("stock", "lookupd_info"), lookupd=L,
                    path="/info")
    assert info.version == "1.3.0" and info.ha_support is None


@needs_captures
def test_every_lookupd_capture_is_understood() -> None:
    """No recorded lookupd response is left out of the parsers' reach."""
    names = sorted(
        (d.name, p.name[: -len(".raw.txt")])
        for d in (CAPTURES / "youzan", CAPTURES / "stock")
        for p in d.glob("*.raw.txt")
        if p.name.startswith(("lookup", "listlookup"))
    )
    assert len(names) >= 32  # as recorded on 2026-11-21
    for flavour, name in names:
        status, body, headers = capture(flavour, name)
        if name.startswith(("lookup_", "lookupd_lookup")):
            assert isinstance(lookup_of(status, body, headers), LookupAnswer), name
        elif name.startswith("listlookup"):
            assert parse_listlookup(decode(status, headers, body), lookupd=L) is not None
        else:
            model = {"lookupd_nodes": NodesModel, "lookupd_topics": TopicsModel,
                     "lookupd_info": LookupdInfo}[name.split(".")[0]]
            validate(model, decode(status, headers, body), lookupd=L, path="/")


# -- any bytes -----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 70000) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=12,
)
peerish = st.fixed_dictionaries({}, optional={
    "broadcast_address": st.one_of(st.text(max_size=6), json_values),
    "address": st.text(max_size=6),
    "tcp_port": st.one_of(st.integers(-1, 70000), json_values),
    "http_port": st.integers(-1, 70000),
})
lookupish = st.fixed_dictionaries({}, optional={
    "channels": st.one_of(st.lists(st.text(max_size=4), max_size=2), json_values),
    "producers": st.one_of(st.lists(peerish, max_size=3), json_values),
    "partitions": st.one_of(st.dictionaries(st.text(max_size=5), peerish, max_size=3),
                            json_values),
    "meta": st.one_of(st.dictionaries(st.sampled_from(["partition_num", "replica", "ordered"]),
                                      json_values, max_size=3), json_values),
})


@settings(max_examples=300, deadline=None)
@given(status=st.sampled_from([200, 200, 404, 500, 400]), body=st.binary(max_size=200),
       v1=st.booleans())
def test_any_bytes_are_parsed_or_rejected(status: int, body: bytes, v1: bool) -> None:
    with contextlib.suppress(LookupdError):
        lookup_of(status, body, V1 if v1 else {})


@settings(max_examples=300, deadline=None)
@given(doc=lookupish, wrapped=st.booleans())
def test_any_json_is_parsed_or_rejected(doc: dict[str, Any], wrapped: bool) -> None:
    body = json.dumps({"status_code": 200, "status_txt": "OK", "data": doc} if wrapped
                      else doc).encode()
    try:
        ans = lookup_of(200, body, {} if wrapped else V1)
    except LookupdError:
        return
    for node in (*ans.partitions.values(), *ans.legacy):
        assert 0 < node.tcp_port < 65536 and node.broadcast_address


@settings(max_examples=200, deadline=None)
@given(doc=json_values)
def test_any_json_listlookup_is_parsed_or_rejected(doc: Any) -> None:
    with contextlib.suppress(LookupdError):
        parse_listlookup(doc, lookupd=L)


def test_deeply_nested_json_is_rejected_not_crashing() -> None:
    with pytest.raises(LookupdError):
        lookup_of(200, b"[" * 100000 + b"]" * 100000, V1)


def test_listlookup_of_thousands_keeps_the_first_and_the_leader(
        caplog: pytest.LogCaptureFixture) -> None:
    # a bug or a hostile server listing 10,000 lookupds (with repeats): every lookup round
    # asks each known lookupd, so the list is cut, naming how long it was
    def node(i: int) -> dict[str, object]:
        ip = f"10.1.{i // 250}.{i % 250 + 1}"
        return {"ID": ip, "NodeIP": ip, "TcpPort": "4160", "HttpPort": "4161", "Epoch": 7}

    nodes = [node(i % 5000) for i in range(10_000)]
    doc = {"lookupdnodes": nodes, "lookupdleader": node(9999)}
    cl = parse_listlookup(doc, lookupd=L)
    assert cl is not None
    assert len(cl.lookupds) == MAX_LISTED_LOOKUPDS + 1
    assert cl.lookupds[:2] == ("http://10.1.0.1:4161", "http://10.1.0.2:4161")
    assert cl.leader == cl.lookupds[-1] == "http://10.1.39.250:4161"
    assert "lists 5000 lookupds; using the first 32 (and the leader)" in caplog.text
    # repeats are one lookupd: a list of 40 entries naming 32 is not cut
    caplog.clear()
    doc = {"lookupdnodes": [node(i % 32) for i in range(40)], "lookupdleader": node(0)}
    cl = parse_listlookup(doc, lookupd=L)
    assert cl is not None and len(cl.lookupds) == 32 and "using the first" not in caplog.text
