"""Options of the embedded nsqd (docs/protocol.md §10.1 defaults).

Durations are seconds (floats), so tests can use short ones (``msg_timeout=1.0``). Options whose
default differs between stock and youzan nsqd are ``None`` here and resolved per flavour by
:meth:`NsqdOptions.resolved`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from smartnsq.devcluster.meta import Flavour

#: ``async (secret, remote_addr) -> auth-server document | None`` (see :mod:`.auth`)
AuthCallback = Callable[[str, str], Awaitable[dict[str, Any] | None]]

MIB = 1024 * 1024


@dataclass
class NsqdOptions:
    #: default in-flight timeout and the largest one IDENTIFY may ask for
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_msg_size: int = 1 * MIB
    max_body_size: int = 5 * MIB
    max_rdy_count: int = 2500
    #: the default heartbeat interval is half of it
    client_timeout: float = 60.0
    max_heartbeat_interval: float = 60.0
    #: REQ delays are clamped to it and DPUB delays checked against it (stock 1 h, youzan 3 d)
    max_req_timeout: float | None = None
    #: what a client gets without asking in IDENTIFY (stock 16 KiB / 250 ms, youzan 100 B / 50 ms)
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    max_output_buffer_size: int = 65536
    min_output_buffer_timeout: float = 0.025
    #: stock 30 s, youzan 1 s
    max_output_buffer_timeout: float | None = None
    snappy_enabled: bool = True
    deflate_enabled: bool = True
    max_deflate_level: int = 6
    #: PEM files; with both set IDENTIFY can negotiate ``tls_v1``
    tls_cert: str | None = None
    tls_key: str | None = None
    #: every command but IDENTIFY needs a TLS connection first
    tls_required: bool = False
    #: PEM file of the CAs that sign client certificates; with it every TLS client must show
    #: one they signed (nsqd's ``--tls-client-auth-policy=require-verify``), and TLS is
    #: required as with ``tls_required`` (nsqd turns ``--tls-required`` on for any policy).
    #: A refused client closes without the TLS alert nsqd sends (asyncio sends none)
    tls_client_ca_file: str | None = None
    #: auth is enabled when either is set; the callback is asked first
    auth_callback: AuthCallback | None = None
    #: base URL of an nsq auth server (``http://host:port/auth``); queried with
    #: ``remote_ip``, ``tls``, ``secret`` and ``common_name`` like nsqd does
    auth_http_url: str | None = None
    #: youzan: connections beyond this get ``too much client connections``
    max_conn_for_client: int = 500000
    #: youzan: True = cluster mode (topics come from lookupd; INTERNAL_CREATE_TOPIC refused,
    #: offset searches allowed); False = a standalone nsqd
    cluster_mode: bool = True
    #: youzan ``allow_ext_compatible`` / ``allow_sub_ext_compatible`` (docs/protocol.md §5.7, §5.4)
    allow_ext_compatible: bool = False
    allow_sub_ext_compatible: bool = False
    #: hostname reported in /info, stats and lookupd; empty = the machine's name
    hostname: str = ""
    #: youzan: seconds after which ``/channel/setoffset`` moves the channel (0: at once). Real
    #: nsqd answers first and hands the move to the channel's loop, so a ``/stats`` read at
    #: once can still show the old position (docs/protocol.md §13.2.1); usually the move is
    #: done within the next request, which 0 models, and a lag makes the slow case certain
    setoffset_lag: float = 0.0

    def resolved(self, flavour: Flavour) -> NsqdOptions:
        """A copy with the flavour-dependent defaults filled in."""
        youzan = flavour == "youzan"
        return dataclasses.replace(
            self,
            max_req_timeout=self.max_req_timeout
            if self.max_req_timeout is not None
            else (3 * 24 * 3600.0 if youzan else 3600.0),
            output_buffer_size=self.output_buffer_size
            if self.output_buffer_size is not None
            else (100 if youzan else 16384),
            output_buffer_timeout=self.output_buffer_timeout
            if self.output_buffer_timeout is not None
            else (0.05 if youzan else 0.25),
            max_output_buffer_timeout=self.max_output_buffer_timeout
            if self.max_output_buffer_timeout is not None
            else (1.0 if youzan else 30.0),
        )

    @property
    def auth_enabled(self) -> bool:
        return self.auth_callback is not None or bool(self.auth_http_url)

    @property
    def requires_tls(self) -> bool:
        return self.tls_required or self.tls_client_ca_file is not None

    @property
    def heartbeat_interval(self) -> float:
        """The default heartbeat interval: half the client timeout."""
        return self.client_timeout / 2
