"""Validation of names and values, raising before anything is sent."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from smartnsq.errors import ConfigError, InvalidNameError

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")

#: highest partition id youzan nsqd accepts (docs/protocol.md §12.14)
MAX_PARTITION = 1023
#: the partition id of what is not partitioned: a stock nsqd, an old youzan nsqd, a topic
#: subscribed by direct address (never sent: such commands have no partition token)
NO_PARTITION = -1
#: RDY upper bound when the server did not say (stock/youzan default max_rdy_count)
DEFAULT_MAX_RDY_COUNT = 2500
#: REQ/DPUB delays: youzan allows 3 days (stock 1 h is enforced by the server's clamp)
MAX_DELAY_MS = 3 * 24 * 3600 * 1000


def valid_name(name: str) -> bool:
    # fullmatch: "$" would also accept a trailing newline
    return 0 < len(name) <= 64 and _NAME_RE.fullmatch(name) is not None


def check_topic(topic: str) -> str:
    if not isinstance(topic, str) or not valid_name(topic):
        raise InvalidNameError(
            f"invalid topic name {topic!r}: 1-64 characters of [.a-zA-Z0-9_-], "
            "optionally ending in #ephemeral"
        )
    return topic


def check_channel(channel: str) -> str:
    if not isinstance(channel, str) or not valid_name(channel):
        raise InvalidNameError(
            f"invalid channel name {channel!r}: 1-64 characters of [.a-zA-Z0-9_-], "
            "optionally ending in #ephemeral"
        )
    return channel


def check_partition(partition: int) -> int:
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise ConfigError(f"partition must be an int, got {type(partition).__name__}")
    if not 0 <= partition <= MAX_PARTITION:
        raise ConfigError(f"partition {partition} out of range 0..{MAX_PARTITION}")
    return partition


def check_body(body: bytes | bytearray | memoryview, max_size: int | None = None) -> None:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ConfigError(f"message body must be bytes, got {type(body).__name__}")
    n = len(body)
    if n == 0:
        raise ConfigError("message body must not be empty")
    if max_size is not None and n > max_size:
        raise ConfigError(f"message body of {n} bytes exceeds the limit of {max_size} bytes")


def check_delay_ms(delay_ms: int, what: str = "delay") -> int:
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int):
        raise ConfigError(f"{what} must be an int of milliseconds")
    if not 0 <= delay_ms <= MAX_DELAY_MS:
        raise ConfigError(f"{what} {delay_ms} ms out of range 0..{MAX_DELAY_MS}")
    return delay_ms


def check_rdy(count: int, max_rdy_count: int = DEFAULT_MAX_RDY_COUNT) -> int:
    if isinstance(count, bool) or not isinstance(count, int):
        raise ConfigError("RDY count must be an int")
    if not 0 <= count <= max_rdy_count:
        raise ConfigError(f"RDY count {count} out of range 0..{max_rdy_count}")
    return count


def parse_tcp_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:port``) → (host, port)."""
    if not isinstance(address, str) or not address:
        raise ConfigError(f"invalid address {address!r}: expected host:port")
    if "://" in address:
        raise ConfigError(f"invalid address {address!r}: expected host:port, without a "
                          "scheme (nsqd's TCP port speaks no URL)")
    if any(c.isspace() or c == "/" for c in address):
        raise ConfigError(f"invalid address {address!r}: expected host:port (no spaces or "
                          "slashes)")
    host, sep, port_s = address.rpartition(":")
    if not sep or not host or not port_s.isdigit():
        raise ConfigError(f"invalid address {address!r}: expected host:port")
    port = int(port_s)
    if not 0 < port < 65536:
        raise ConfigError(f"invalid address {address!r}: port out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def is_https_address(address: str) -> bool:
    """Whether an HTTP address (as :func:`parse_http_address` takes it) names HTTPS."""
    return address.strip().lower().startswith("https://")


def parse_http_address(address: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` → base URL without trailing slash."""
    if not isinstance(address, str) or not address.strip():
        raise ConfigError(f"invalid HTTP address {address!r}")
    url = address.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"invalid HTTP address {address!r}: expected host:port or http URL")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"invalid HTTP address {address!r}: bad port") from None
    if port is None:
        raise ConfigError(f"invalid HTTP address {address!r}: a port is required")
    if parts.path not in ("", "/") or parts.query:
        raise ConfigError(f"invalid HTTP address {address!r}: no path or query allowed")
    return f"{parts.scheme}://{parts.netloc}"
