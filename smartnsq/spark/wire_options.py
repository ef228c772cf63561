"""How the ``nsq`` source and sink reach a secured nsqd: the options ``tls``,
``tlsRootCaFile``, ``tlsCert``, ``tlsKey``, ``tlsInsecureSkipVerify``, ``snappy``,
``deflate``, ``deflateLevel`` and ``authSecret`` (the command line's ``--tls…``,
``--snappy``, ``--deflate…``, ``--auth-secret``), parsed for both in one place.

They are checked on the driver (wrong combinations, certificate files that do not load there)
and turned into each connection's :class:`~smartnsq.config.ConnectionConfig` by
:meth:`WireOptions.connection`, wherever the connection is made (executors; the driver for
stock streams and youzan probing). Without ``authSecret``, the secret is read there from
``SMARTNSQ_AUTH_SECRET``. The secret is held as a ``SecretStr`` and never shown: an
option's value is shown in messages only when Spark would not redact it either.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr

from smartnsq.config import ConnectionConfig, TLSConfig
from smartnsq.errors import ConfigError
from smartnsq.spark.option_names import WIRE_OPTION_NAMES

__all__ = ["AUTH_SECRET_ENV", "KAFKA_WIRE_NAMES", "WIRE_OPTION_NAMES", "WireOptions",
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


class WireOptions(BaseModel):
    """TLS, compression and AUTH of every connection a read or write makes (checked)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tls: TLSConfig | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int | None = None
    auth_secret: SecretStr | None = None

    def connection(self, **fields: Any) -> ConnectionConfig:
        """A ``ConnectionConfig`` with ``fields`` and these settings; the secret from
        :data:`AUTH_SECRET_ENV` of this process when the option did not give one."""
        secret = self.auth_secret
        env = os.environ.get(AUTH_SECRET_ENV, "")
        if secret is None and env.strip():
            secret = SecretStr(env)
        extra: dict[str, Any] = {"tls": self.tls or TLSConfig(), "snappy": self.snappy,
                                 "deflate": self.deflate, "auth_secret": secret}
        if self.deflate_level is not None:
            extra["deflate_level"] = self.deflate_level
        return ConnectionConfig(**fields, **extra)


def parse_wire_options(given: Mapping[str, str],
                       fail: Callable[[str], ConfigError]) -> WireOptions:
    """``given``: the wire options by documented name. ``fail`` makes the caller's error
    from ``NAME=VALUE: why`` (the source and the sink word their option errors each their
    own way)."""

    def bad(name: str, why: str) -> ConfigError:
        return fail(f"{name}={shown(name, given[name])}: {why}")

    def flag(name: str) -> bool | None:
        if name not in given:
            return None
        try:
            return parse_flag(given[name])
        except ValueError as exc:
            raise bad(name, str(exc)) from None

    tls_on, insecure = flag("tls"), flag("tlsInsecureSkipVerify")
    snappy, deflate = bool(flag("snappy")), bool(flag("deflate"))
    tls_given = [n for n in ("tlsRootCaFile", "tlsCert", "tlsKey", "tlsInsecureSkipVerify")
                 if n in given]
    if tls_on is False and tls_given:
        raise bad(tls_given[0], f"needs tls=true (got tls={given['tls']!r})")
    if "tlsKey" in given and "tlsCert" not in given:
        raise bad("tlsKey", "needs tlsCert (the client certificate it is the key of)")
    if snappy and deflate:
        raise fail(f"snappy={given['snappy']!r} and deflate={given['deflate']!r}: give one "
                   "(a connection is compressed one way)")
    level: int | None = None
    if "deflateLevel" in given:
        if not deflate:
            raise bad("deflateLevel", "needs deflate=true")
        try:
            level = int(given["deflateLevel"].strip())
        except ValueError:
            raise bad("deflateLevel", "expected an integer 1-9") from None
        if not 1 <= level <= 9:
            raise bad("deflateLevel", "expected an integer 1-9")
    secret: SecretStr | None = None
    if "authSecret" in given:
        if not given["authSecret"].strip():
            raise fail(f"authSecret is empty (leave it out to use {AUTH_SECRET_ENV} of the "
                       "processes that connect)")
        secret = SecretStr(given["authSecret"])
    tls = None
    if tls_on or tls_given:
        files = {n: given[n].strip() for n in _FILES if n in given}
        cert = files.get("tlsCert")
        # a certificate file without tlsKey holds its key too (one PEM, as trustme writes)
        tls = TLSConfig(enabled=True, ca_file=files.get("tlsRootCaFile"), cert_file=cert,
                        key_file=files.get("tlsKey", cert), verify=not insecure)
        _check_files(tls, files, bad)
    return WireOptions(tls=tls, snappy=snappy, deflate=deflate, deflate_level=level,
                       auth_secret=secret)


def _check_files(tls: TLSConfig, files: Mapping[str, str],
                 bad: Callable[[str, str], ConfigError]) -> None:
    """Load the certificate files here, on the driver: a path missing or unusable here is
    refused naming its option, instead of failing every task on the executors."""
    from smartnsq.conn.transport import tls_context

    for name, path in files.items():
        if not os.path.isfile(path):
            raise bad(name, f"no such file on the driver (working directory {os.getcwd()}); "
                            "certificate files are read where the connections are made: the "
                            "path must exist on the driver and on every executor")
    checks: list[tuple[str, TLSConfig]] = []
    if "tlsRootCaFile" in files:
        checks.append(("tlsRootCaFile", TLSConfig(enabled=True, ca_file=tls.ca_file)))
    if "tlsCert" in files:
        checks.append(("tlsKey" if "tlsKey" in files else "tlsCert", tls))
    for name, cfg in checks:
        try:
            tls_context(cfg)
        except ConfigError as exc:
            why = exc.__cause__ or exc
            raise bad(name, f"cannot be loaded: {' '.join(str(why).split())}") from None
