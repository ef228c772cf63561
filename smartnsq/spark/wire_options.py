"""How the ``nsq`` source and sink reach a secured nsqd: the options ``tls``,
``tlsRootCaFile``, ``tlsCert``, ``tlsKey``, ``tlsInsecureSkipVerify``, ``snappy``,
``deflate``, ``deflateLevel`` and ``authSecret`` (the command line's ``--tls…``,
``--snappy``, ``--deflate…``, ``--auth-secret``), parsed for both in one place.

They are checked on the driver (wrong combinations, certificate files that do not load there)
and held as a :class:`~smartnsq.wire_settings.WireSettings`, which makes each connection's
:class:`~smartnsq.config.ConnectionConfig` wherever the connection is made (executors; the
driver for stock streams and youzan probing). Without ``authSecret``, the secret is read there from
``SMARTNSQ_AUTH_SECRET``. The secret is held as a ``SecretStr`` and never shown: an
option's value is shown in messages only when Spark would not redact it either.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

from smartnsq.errors import ConfigError
from smartnsq.spark.option_names import WIRE_OPTION_NAMES
from smartnsq.wire_settings import Setting, WireSettings, wire_settings

__all__ = ["AUTH_SECRET_ENV", "KAFKA_WIRE_NAMES", "WIRE_OPTION_NAMES", "no_wire_options",
           "parse_flag", "parse_wire_options", "shown"]

#: where the connecting process finds the secret when the option is not given
AUTH_SECRET_ENV = "SMARTNSQ_AUTH_SECRET"
#: Spark's default spark.redaction.regex: an option whose key or value matches is redacted
_REDACT = re.compile(r"(?i)secret|password|token")
_FILES = ("tlsRootCaFile", "tlsCert", "tlsKey")

#: Kafka's security options (lower-cased, as Spark passes keys) and what the nsq side calls
#: them, for the "unknown option" answers of the source and the sink
KAFKA_WIRE_NAMES = {
    "kafka.security.protocol": "tls=true (and authSecret for nsqd's AUTH)",
    "kafka.ssl.truststore.location": "tlsRootCaFile (a PEM file)",
    "kafka.ssl.keystore.location": "tlsCert and tlsKey (PEM files)",
    "kafka.ssl.endpoint.identification.algorithm": "tlsInsecureSkipVerify=true to skip the "
                                                   "check (testing only)",
    "kafka.sasl.jaas.config": "authSecret (nsqd's AUTH secret)",
    "kafka.compression.type": "snappy=true or deflate=true",
}


def shown(key: str, value: str) -> str:
    """``repr(value)`` for a message, or a placeholder where Spark redacts it (UI, plan)."""
    if _REDACT.search(key) or _REDACT.search(value):
        return "*********(redacted)"
    return repr(value)


def parse_flag(value: str) -> bool:
    """An option's true / false (also 1 / 0, yes / no); ValueError otherwise."""
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


def no_wire_options() -> WireSettings:
    """The settings of a read or write given no wire option (plain connections; the secret
    may still come from :data:`AUTH_SECRET_ENV`)."""
    return WireSettings(secret_env=AUTH_SECRET_ENV)


#: the option of each setting, as the rules name them in messages
_NAMES: dict[Setting, str] = {
    "tls": "tls=true", "ca": "tlsRootCaFile", "cert": "tlsCert", "key": "tlsKey",
    "insecure": "tlsInsecureSkipVerify", "snappy": "snappy=true", "deflate": "deflate=true",
    "level": "deflateLevel", "secret": "authSecret"}


def parse_wire_options(given: Mapping[str, str],
                       fail: Callable[[str], ConfigError]) -> WireSettings:
    """``given``: the wire options by documented name. ``fail`` makes the caller's error
    from ``NAME=VALUE: why`` (the source and the sink word their option errors each their
    own way). The rules are :func:`smartnsq.wire_settings.wire_settings`'s; a connection
    made from them reads the secret from :data:`AUTH_SECRET_ENV` when no option gave one."""

    def bad(name: str, why: str) -> ConfigError:
        return fail(f"{name}={shown(name, given[name])}: {why}")

    def refuse(setting: Setting, why: str) -> ConfigError:
        name = _NAMES[setting].removesuffix("=true")
        return bad(name, why)

    def flag(name: str) -> bool | None:
        if name not in given:
            return None
        try:
            return parse_flag(given[name])
        except ValueError as exc:
            raise bad(name, str(exc)) from None

    level: int | None = None
    if "deflateLevel" in given:
        try:
            level = int(given["deflateLevel"].strip())
        except ValueError:
            raise bad("deflateLevel", "expected an integer 1-9") from None
    files = {n: given[n].strip() for n in _FILES if n in given}
    for name, path in files.items():
        if not os.path.isfile(path):
            raise bad(name, f"no such file on the driver (working directory {os.getcwd()}); "
                            "certificate files are read where the connections are made: the "
                            "path must exist on the driver and on every executor")
    return wire_settings(
        _NAMES, refuse, tls=flag("tls"), ca=files.get("tlsRootCaFile"),
        cert=files.get("tlsCert"), key=files.get("tlsKey"),
        insecure=bool(flag("tlsInsecureSkipVerify")), snappy=bool(flag("snappy")),
        deflate=bool(flag("deflate")), level=level, secret=given.get("authSecret"),
        secret_env=AUTH_SECRET_ENV)
