"""TLS, compression and AUTH given as separate settings (the command line's ``--tls…``,
``--snappy``, ``--deflate…`` and ``--auth-secret`` options, the Spark connector's ``tls…``,
``snappy``, ``deflate…`` and ``authSecret`` options), checked by one set of rules and turned
into each connection's :class:`~smartnsq.config.ConnectionConfig`.

The rules: any TLS file (or skipping verification) turns TLS on, and is refused when TLS is
explicitly off; a client certificate without a key file holds its key too (one PEM, as
trustme and many CAs write them); a key needs its certificate; snappy and deflate exclude
each other; a deflate level needs deflate and is 1-9; an empty secret is a mistake, not "no
secret". Certificate files are loaded at once, so a file that is no certificate is refused
naming its setting before anything connects. Each front end names the settings its own way
(``names``) and words the refusal (``refuse``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr

from smartnsq.config import ConnectionConfig, TLSConfig
from smartnsq.errors import ConfigError

__all__ = ["Setting", "WireSettings", "wire_settings"]

#: the settings, as the rules refer to them; a front end maps each to its option's name
Setting = Literal["tls", "ca", "cert", "key", "insecure", "snappy", "deflate", "level",
                  "secret"]


class WireSettings(BaseModel):
    """Checked TLS, compression and AUTH settings (picklable: the Spark connector ships them
    to its executors)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tls: TLSConfig | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int | None = None
    auth_secret: SecretStr | None = None
    #: the environment variable the connecting process (for Spark, an executor) reads the
    #: secret from when none was given
    secret_env: str | None = None

    def connection(self, **fields: Any) -> ConnectionConfig:
        """A ``ConnectionConfig`` with ``fields`` and these settings."""
        secret = self.auth_secret
        if secret is None and self.secret_env is not None:
            value = os.environ.get(self.secret_env, "")
            secret = SecretStr(value) if value.strip() else None
        extra: dict[str, Any] = {"tls": self.tls or TLSConfig(), "snappy": self.snappy,
                                 "deflate": self.deflate, "auth_secret": secret}
        if self.deflate_level is not None:
            extra["deflate_level"] = self.deflate_level
        return ConnectionConfig(**fields, **extra)


def wire_settings(names: Mapping[Setting, str],
                  refuse: Callable[[Setting, str], Exception], *,
                  tls: bool | None = None, ca: str | None = None, cert: str | None = None,
                  key: str | None = None, insecure: bool = False, snappy: bool = False,
                  deflate: bool = False, level: int | None = None,
                  secret: str | None = None, secret_env: str | None = None) -> WireSettings:
    """The settings checked (see the module docstring). ``tls``: None when not given.
    ``refuse(setting, why)`` makes the front end's error for ``setting``; ``why`` does not
    name that setting, the other settings it mentions are named by ``names``."""
    files: tuple[tuple[Setting, object], ...] = (("ca", ca), ("cert", cert), ("key", key),
                                                  ("insecure", insecure))
    given = [s for s, v in files if v]
    if tls is False and given:
        raise refuse(given[0], f"needs {names['tls']}")
    if key is not None and cert is None:
        raise refuse("key", f"needs {names['cert']} (the client certificate it is the key of)")
    if snappy and deflate:
        raise refuse("deflate", f"cannot be used with {names['snappy']} (a connection is "
                                "compressed one way)")
    if level is not None:
        if not deflate:
            raise refuse("level", f"needs {names['deflate']}")
        if not 1 <= level <= 9:
            raise refuse("level", f"expected an integer 1-9, got {level}")
    if secret is not None and not secret.strip():
        raise refuse("secret", "is empty")
    tls_config = None
    if tls or given:
        tls_config = TLSConfig(enabled=True, ca_file=ca, cert_file=cert,
                               key_file=key or cert, verify=not insecure)
        _load(tls_config, refuse)
    return WireSettings(tls=tls_config, snappy=snappy, deflate=deflate, deflate_level=level,
                        auth_secret=None if secret is None else SecretStr(secret),
                        secret_env=secret_env)


def _load(tls: TLSConfig, refuse: Callable[[Setting, str], Exception]) -> None:
    """Load the files now: one that is no certificate (or key) is refused naming it."""
    from smartnsq.conn.transport import tls_context

    checks: list[tuple[Setting, TLSConfig]] = []
    if tls.ca_file is not None:
        checks.append(("ca", TLSConfig(enabled=True, ca_file=tls.ca_file)))
    if tls.cert_file is not None:
        checks.append(("key" if tls.key_file != tls.cert_file else "cert", tls))
    for setting, cfg in checks:
        try:
            tls_context(cfg)
        except ConfigError as exc:
            why = exc.__cause__ or exc
            raise refuse(setting, f"cannot be loaded: {' '.join(str(why).split())}") from None
