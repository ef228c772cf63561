"""The TLS, compression and AUTH options of the nsq source and sink, without Spark: one
parser for both, checked on the driver naming the option, the secret never shown (also not
for a misspelled key), and the secret from SMARTNSQ_AUTH_SECRET of the connecting process."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from smartnsq.errors import ConfigError, SourceOptionError
from smartnsq.spark.fetch import RangeTask
from smartnsq.spark.options import parse_source_options
from smartnsq.spark.sink_options import parse_sink_options
from smartnsq.spark.source_stock import _consumer_config
from tests.real_upgrades_support import Certs

SECRET = "s3cret-h71-wire"



def read(**kw: str) -> Any:
    return parse_source_options({"lookupd": "127.0.0.1:4161", "topic": "t", **kw},
                                streaming=False)


def write(**kw: str) -> Any:
    return parse_sink_options({"nsqd": "127.0.0.1:4150", "topic": "t", **kw})


def test_source_and_sink_turn_the_options_into_the_same_connection(certs: Certs) -> None:
    given = {"tlsRootCaFile": certs.ca_file, "tlsCert": certs.client_pem, "deflate": "true",
             "deflateLevel": "3", "authSecret": SECRET}
    for opts in (read(**given), write(**given)):
        conn = opts.wire.connection(client_id="x")
        # a TLS file turns TLS on; a certificate without tlsKey holds its key
        assert conn.tls.enabled and conn.tls.verify and conn.tls.ca_file == certs.ca_file
        assert conn.tls.cert_file == conn.tls.key_file == certs.client_pem
        assert conn.deflate and conn.deflate_level == 3 and not conn.snappy
        assert conn.auth_secret is not None and conn.auth_secret.get_secret_value() == SECRET
        assert conn.client_id == "x"
        # shown, pickled to the executors: the secret stays hidden and arrives
        assert SECRET not in repr(opts) and SECRET not in str(opts)
        back = pickle.loads(pickle.dumps(opts))
        assert back.wire.auth_secret.get_secret_value() == SECRET
    src = read(**given, snappy="false", tlsInsecureSkipVerify="true")
    assert src.wire.tls.verify is False
    assert _consumer_config(src, 10).connection.tls.enabled
    # the youzan range reads get them through their (pickled) task
    task = RangeTask(("127.0.0.1:4161",), "t", 0, 0, 10, "c", wire=src.wire)
    assert pickle.loads(pickle.dumps(task)).wire == src.wire
    # without options: plain, as before
    assert read().wire.connection().tls.enabled is False
    assert write().wire.connection().auth_secret is None


def test_the_secret_comes_from_the_environment_of_the_connecting_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    opts = read(tls="true")
    monkeypatch.setenv("SMARTNSQ_AUTH_SECRET", SECRET)
    secret = opts.wire.connection().auth_secret
    assert secret is not None and secret.get_secret_value() == SECRET
    # the option wins over the environment
    given = read(authSecret="from-option").wire.connection().auth_secret
    assert given is not None and given.get_secret_value() == "from-option"
    monkeypatch.setenv("SMARTNSQ_AUTH_SECRET", " ")
    assert opts.wire.connection().auth_secret is None


@pytest.mark.parametrize(("given", "named"), [
    ({"snappy": "true", "deflate": "true"}, "deflate='true': cannot be used with snappy=true"),
    ({"deflateLevel": "3"}, "deflateLevel='3': needs deflate=true"),
    ({"deflate": "true", "deflateLevel": "10"}, "deflateLevel='10': expected an integer 1-9"),
    ({"deflate": "true", "deflateLevel": "high"}, "deflateLevel='high'"),
    ({"tls": "false", "tlsInsecureSkipVerify": "true"},
     "tlsInsecureSkipVerify='true': needs tls=true"),
    ({"tls": "maybe"}, "tls='maybe': expected true or false"),
    ({"tlsRootCaFile": "/nonexistent/ca.pem"},
     "tlsRootCaFile='/nonexistent/ca.pem': no such file on the driver"),
    ({"tlsKey": __file__}, "tlsKey=.*needs tlsCert"),
    ({"tlsRootCaFile": __file__}, "tlsRootCaFile=.*cannot be loaded"),
    ({"tlsCert": __file__}, "tlsCert=.*cannot be loaded"),
    ({"authSecret": " "}, r"authSecret=\*+\(redacted\): is empty"),
])
def test_wrong_combinations_are_refused_naming_the_option(given: dict[str, str],
                                                          named: str) -> None:
    with pytest.raises(SourceOptionError, match=f"^option {named}"):
        read(**given)
    with pytest.raises(ConfigError, match=f"^nsq sink option {named}"):
        write(**given)


def test_tls_files_with_tls_false_are_refused(certs: Certs) -> None:
    with pytest.raises(SourceOptionError, match=r"option tlsRootCaFile=.*needs tls=true"):
        read(tls="false", tlsRootCaFile=certs.ca_file)
    with pytest.raises(ConfigError, match=r"nsq sink option tlsCert=.*needs tls=true"):
        write(tls="FALSE", tlsCert=certs.client_pem)


@pytest.mark.parametrize("key", ["authSecrett", "auth_secret", "kafka.sasl.jaas.config",
                                 "password"])
def test_a_misspelled_secret_option_does_not_show_its_value(key: str) -> None:
    value = f"org.apache.kafka.common.security.plain.PlainLoginModule password={SECRET}" \
        if key.startswith("kafka") else SECRET
    with pytest.raises(SourceOptionError) as err:
        read(**{key: value})
    assert SECRET not in str(err.value) and "redacted" in str(err.value)
    with pytest.raises(ConfigError) as err2:
        write(**{key: value})
    assert SECRET not in str(err2.value)
    # a harmless value is still shown, as before
    with pytest.raises(SourceOptionError, match="'tlsRootCa'='x'"):
        read(tlsRootCa="x")


def test_kafka_security_options_are_answered_with_the_nsq_names() -> None:
    with pytest.raises(SourceOptionError, match=r"a Kafka option; the nsq name is "
                                                r"tlsRootCaFile"):
        read(**{"kafka.ssl.truststore.location": "/etc/kafka/truststore.jks"})
    with pytest.raises(ConfigError, match=r"the nsq name is authSecret") as err:
        write(**{"kafka.sasl.jaas.config": f"PlainLoginModule password={SECRET}"})
    assert SECRET not in str(err.value)
