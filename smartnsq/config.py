"""Configuration models, validated once at construction.

Defaults follow go-nsq (docs/protocol.md §10.2) unless a comment says why not. Durations are in
seconds (floats) on the Python side and converted to the wire's milliseconds where needed.
A bad value raises :class:`smartnsq.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from smartnsq._version import __version__
from smartnsq.errors import ConfigError
from smartnsq.protocol.validation import MAX_DELAY_MS

#: IDENTIFY's user_agent and the HTTP clients' User-Agent: the package's one version
USER_AGENT = f"smartnsq/{__version__}"
#: seconds: nsqd's default --msg-timeout, what ``msg_timeout`` 0 means
DEFAULT_MSG_TIMEOUT = 60.0


class _Model(BaseModel):
    # allow_inf_nan=False: no NaN or infinity may ever reach a loop timer or the wire
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _config_error(type(self).__name__, exc) from None

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied and validated."""
        return type(self)(**{**self.model_dump(), **changes})


def _config_error(model: str, exc: ValidationError) -> ConfigError:
    problems = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(model)"
        problems.append(f"{field}: {err['msg']}")
    return ConfigError(f"invalid {model}: " + "; ".join(problems))


class TLSConfig(_Model):
    """TLS upgrade settings. Certificate verification is on unless ``verify`` is False."""

    enabled: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    #: server name to verify; defaults to the host connected to
    server_hostname: str | None = None

    @model_validator(mode="after")
    def _pairs(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be given together")
        given = [f for f in ("ca_file", "cert_file", "key_file", "server_hostname")
                 if getattr(self, f) is not None]
        if given and not self.enabled:
            # else the connection would silently stay plain text
            raise ValueError(f"{', '.join('tls.' + f for f in given)} given but tls.enabled "
                             "is False (set enabled=True to use TLS)")
        return self


class ConnectionConfig(_Model):
    """Per-connection settings: IDENTIFY fields, TLS, compression, AUTH, timeouts."""

    client_id: str = Field(default_factory=lambda: socket.gethostname().split(".")[0])
    hostname: str = Field(default_factory=socket.gethostname)
    user_agent: str = USER_AGENT
    feature_negotiation: bool = True
    #: seconds; -1 disables (producers only), 0 = server default
    heartbeat_interval: float = 30.0
    #: bytes; -1 disables buffering, 0 = server default
    output_buffer_size: int = 16384
    #: seconds; -1 disables the timer flush, 0 = server default
    output_buffer_timeout: float = 0.25
    sample_rate: int = Field(default=0, ge=0, le=99)
    #: seconds; 0 = server default
    msg_timeout: float = Field(default=0.0, ge=0)
    tls: TLSConfig = Field(default_factory=TLSConfig)
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = Field(default=6, ge=1, le=9)
    auth_secret: SecretStr | None = None
    #: stock nsqd 1.3+ locality hints (docs/protocol.md §3.1); sent only when set
    topology_region: str | None = None
    topology_zone: str | None = None
    # youzan IDENTIFY extras (docs/protocol.md §5.3); ignored by stock nsqd
    extend_support: bool = False
    desired_tag: str | None = Field(default=None, max_length=100)
    ext_filter: dict[str, Any] | None = None

    dial_timeout: float = Field(default=1.0, gt=0)
    #: how long the whole handshake (IDENTIFY, upgrades, AUTH) may take
    handshake_timeout: float = Field(default=5.0, gt=0)
    #: no bytes from the server for this long closes the connection; must exceed heartbeats
    read_timeout: float = Field(default=60.0, gt=0)
    write_timeout: float = Field(default=1.0, gt=0)
    #: bound on waiting for CLOSE_WAIT when closing a subscribed connection
    close_timeout: float = Field(default=5.0, gt=0)
    #: frames larger than this are rejected before buffering (0 = 16 MiB safety cap)
    max_frame_size: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.snappy and self.deflate:
            raise ValueError("snappy and deflate cannot both be enabled")
        hb = self.heartbeat_interval
        if hb not in (-1, 0) and not 1.0 <= hb <= 60.0:
            raise ValueError("heartbeat_interval must be -1, 0 or within 1..60 seconds")
        if hb > 0 and self.read_timeout <= hb:
            raise ValueError("read_timeout must exceed heartbeat_interval")
        obs = self.output_buffer_size
        if obs not in (-1, 0) and not 64 <= obs <= 65536:
            raise ValueError("output_buffer_size must be -1, 0 or within 64..65536")
        obt = self.output_buffer_timeout
        # stock rejects 1..24 ms (docs/protocol.md §12.11)
        if obt not in (-1, 0) and not 0.025 <= obt <= 30.0:
            raise ValueError("output_buffer_timeout must be -1, 0 or within 0.025..30 seconds")
        if self.msg_timeout and not 1.0 <= self.msg_timeout <= 900.0:
            raise ValueError("msg_timeout must be 0 or within 1..900 seconds")
        if self.ext_filter is not None:
            _check_json("ext_filter", self.ext_filter)
        return self

    @property
    def effective_max_frame_size(self) -> int:
        return self.max_frame_size or 16 * 1024 * 1024

    def identify_body(self) -> dict[str, Any]:
        """The IDENTIFY JSON object (milliseconds on the wire)."""

        def ms(v: float) -> int:
            return -1 if v == -1 else int(v * 1000)

        body: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": self.feature_negotiation,
            "heartbeat_interval": ms(self.heartbeat_interval),
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": ms(self.output_buffer_timeout),
            "tls_v1": self.tls.enabled,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "sample_rate": self.sample_rate,
            "msg_timeout": ms(self.msg_timeout),
        }
        if self.topology_region:
            body["topology_region"] = self.topology_region
        if self.topology_zone:
            body["topology_zone"] = self.topology_zone
        if self.extend_support:
            body["extend_support"] = True
        if self.desired_tag:
            body["desired_tag"] = self.desired_tag
        if self.ext_filter:
            body["ext_filter"] = self.ext_filter
        return body


class LookupConfig(_Model):
    """The lookup component (smartnsq.lookup)."""

    #: seed nsqlookupd HTTP addresses, ``host:port`` or ``http://host:port``
    addresses: tuple[str, ...]
    poll_interval: float = Field(default=60.0, gt=0)
    poll_jitter: float = Field(default=0.3, ge=0, le=1)
    #: per-request timeout (connect + read)
    request_timeout: float = Field(default=2.0, gt=0)
    #: consecutive failures after which a lookupd is demoted
    failure_threshold: int = Field(default=3, ge=1)
    #: backoff for retrying a demoted lookupd, doubling up to the max
    demoted_retry_min: float = Field(default=1.0, gt=0)
    demoted_retry_max: float = Field(default=60.0, gt=0)
    use_listlookup: bool = True
    #: a topic nobody asked about (lookup, refresh, view, stale report) and nobody subscribes
    #: to for this many poll intervals stops being refreshed and is forgotten (5 min at the
    #: default poll): a process that looks up many topics once keeps no refresher per topic
    idle_polls: int = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Self:
        _ordered(self, "demoted_retry_min", "demoted_retry_max")
        if not self.addresses:
            raise ValueError("at least one nsqlookupd address is required")
        from smartnsq.protocol.validation import parse_http_address

        for a in self.addresses:
            parse_http_address(a)
        return self


class ConsumerConfig(_Model):
    """Consumer behaviour ("Building Client Libraries"; go-nsq defaults)."""

    max_in_flight: int = Field(default=1, ge=0)
    max_attempts: int = Field(default=5, ge=0)
    #: seconds per attempt for computed requeue delays (go-nsq: 90 s x attempts)
    default_requeue_delay: float = Field(default=90.0, ge=0)
    #: REQ carries at most 3 days (MAX_DELAY_MS); a larger cap could not be sent
    max_requeue_delay: float = Field(default=900.0, ge=0, le=MAX_DELAY_MS / 1000)
    backoff_enabled: bool = True
    backoff_strategy: Literal["exponential", "full_jitter"] = "exponential"
    backoff_multiplier: float = Field(default=1.0, gt=0)
    max_backoff_duration: float = Field(default=120.0, ge=0)
    low_rdy_idle_timeout: float = Field(default=10.0, gt=0)
    low_rdy_timeout: float = Field(default=30.0, gt=0)
    rdy_redistribute_interval: float = Field(default=5.0, gt=0)
    lookupd_poll_interval: float = Field(default=60.0, gt=0)
    lookupd_poll_jitter: float = Field(default=0.3, ge=0, le=1)
    #: reconnect backoff for direct nsqd addresses: doubles from min up to max, with jitter
    reconnect_min: float = Field(default=1.0, gt=0)
    reconnect_max: float = Field(default=60.0, gt=0)
    #: default bound of ``Consumer.stop()``: how long in-flight messages may still be
    #: answered before the rest is requeued (go-nsq waits up to 30 s too)
    drain_timeout: float = Field(default=30.0, ge=0)
    #: ordered consumer: client-side pause before a failed message is retried with
    #: ``REQ <id> 0`` (youzan ignores delayed REQs on ordered channels, docs/protocol.md §12.5)
    ordered_retry_pause: float = Field(default=1.0, ge=0)
    #: ordered consumer: from this many attempts on, a failing message is handed to the
    #: ``on_blocked`` policy (retry / skip / stop)
    blocked_attempts: int = Field(default=5, ge=1)
    #: connects (dial + handshake + SUB) in progress at once: a lookupd listing thousands
    #: of nsqd must not cause thousands of simultaneous dials. go-nsq has no such bound
    #: (it connects to the nsqds of a lookup response one after another)
    max_concurrent_connects: int = Field(default=32, ge=1, le=1024)
    connection: ConnectionConfig = Field(default_factory=ConnectionConfig)

    @model_validator(mode="after")
    def _check(self) -> Self:
        _ordered(self, "reconnect_min", "reconnect_max")
        return self


class ProducerConfig(_Model):
    """Producer behaviour."""

    #: per-publish timeout waiting for the server's answer (youzan go-nsq pub_timeout)
    publish_timeout: float = Field(default=10.0, gt=0)
    #: per-attempt bound: seconds one nsqd may take to answer one publish command. An
    #: attempt unanswered by then fails over (another listed nsqd; lookupd mode: the retry
    #: rule) within the publish's own timeout, and a connection whose oldest unanswered
    #: command is older than this is closed and its nsqd marked down (reconnect backoff),
    #: since an nsqd that stays connected but stops answering would otherwise hold every
    #: publish sent to it for its whole timeout. The clock starts when the command is
    #: queued for writing: raise it for MPUBs of megabytes over slow links. A publish
    #: failed over this way may also have been stored by the silent nsqd (at-least-once).
    request_timeout: float = Field(default=5.0, gt=0)
    #: attempts per publish across nsqds / partitions before it raises
    max_attempts: int = Field(default=3, ge=1, le=15)
    connections_per_nsqd: int = Field(default=2, ge=1, le=64)
    #: auto-batching: 0 disables; otherwise concurrent publishes wait up to linger seconds
    linger: float = Field(default=0.0, ge=0)
    max_batch: int = Field(default=100, ge=1)
    max_body_size: int = Field(default=5 * 1024 * 1024, ge=1024)
    max_msg_size: int = Field(default=1024 * 1024, ge=1)
    #: seconds before redialling an nsqd after a failed dial or a lost connection: doubles
    #: from reconnect_min up to reconnect_max (±25 % jitter); the node is skipped meanwhile
    reconnect_min: float = Field(default=0.1, gt=0)
    reconnect_max: float = Field(default=10.0, gt=0)
    #: shard key → partition rule of publish_ordered: youzan go-nsq's murmur3 (default) or
    #: the youzan Java SDK's String.hashCode rule (docs/protocol.md §8.2)
    shard_hash: Literal["murmur3", "java"] = "murmur3"
    #: dials (connect + handshake) in progress at once across all nsqd (see ConsumerConfig)
    max_concurrent_connects: int = Field(default=32, ge=1, le=1024)
    #: with lookupd= addresses: how often the producer's own Lookup polls (± jitter); a
    #: leader-type error refreshes at once anyway
    lookupd_poll_interval: float = Field(default=60.0, gt=0)
    lookupd_poll_jitter: float = Field(default=0.3, ge=0, le=1)
    connection: ConnectionConfig = Field(
        default_factory=lambda: ConnectionConfig(heartbeat_interval=30.0)
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        _ordered(self, "reconnect_min", "reconnect_max")
        # one message must fit in one MPUB body
        _ordered(self, "max_msg_size", "max_body_size")
        return self


def _ordered(model: BaseModel, low: str, high: str) -> None:
    a, b = getattr(model, low), getattr(model, high)
    if a > b:
        raise ValueError(f"{low} ({a}) must not exceed {high} ({b})")


def _check_json(field: str, value: dict[str, Any]) -> None:
    """``value`` must encode as strict JSON (no NaN/Infinity); name the offending key."""
    for k, v in value.items():
        if not isinstance(k, str):
            raise ValueError(f"{field} key {k!r} is not a string")
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{field}[{k!r}]: {v!r} is not JSON ({exc})") from None

