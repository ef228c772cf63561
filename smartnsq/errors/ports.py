"""An address that answers as another kind of NSQ listener than the one it was given as.

nsqd and nsqlookupd each listen on a TCP and an HTTP port, four numbers that are easy to mix
up (4150/4151 and 4160/4161 by default). What each listener answers to a client of another
kind is fixed, so the client that meets it can say so instead of a parse error:

* nsqd's TCP port answers an HTTP request with a framed error, ``E_BAD_PROTOCOL``
  (``\\x00\\x00\\x00\\x12 \\x00\\x00\\x00\\x01 E_BAD_PROTOCOL``), and closes;
* nsqlookupd's TCP port answers anything but its ``"  V1"`` magic with a length-prefixed
  ``E_BAD_PROTOCOL`` without frame type (``\\x00\\x00\\x00\\x0e E_BAD_PROTOCOL``);
* an HTTP port (either server's) answers the NSQ magic and IDENTIFY with ``HTTP/1.1 400``;
* nsqd's HTTP server answers nsqlookupd's paths (``/lookup``, ``/nodes``) with 404
  ``NOT_FOUND``, and nsqlookupd's answers nsqd's ``/stats`` the same way.

Each error below keeps the class the client raised before for such an answer (so existing
``except`` clauses still catch it) and is also a :class:`WrongPortError`, whose ``address``,
``expected`` and ``found`` say what was wrong. The clients that classify their failures raise
them: :mod:`smartnsq.conn.handshake` (nsqd TCP), :mod:`smartnsq.nsqd_http` (nsqd HTTP) and
:mod:`smartnsq.lookup.client` (nsqlookupd HTTP).
"""

from __future__ import annotations

from smartnsq.errors.base import LookupdError, NsqdUnavailableError, NSQError, ProtocolError

__all__ = ["LookupdWrongPortError", "NsqdHttpWrongPortError", "NsqdTcpWrongPortError",
           "WrongPortError"]

#: the listeners a client can be pointed at, with their default ports
NSQD_TCP = "nsqd TCP"
NSQD_HTTP = "nsqd HTTP"
LOOKUPD_TCP = "nsqlookupd TCP"
LOOKUPD_HTTP = "nsqlookupd HTTP"
DEFAULT_PORTS = {NSQD_TCP: 4150, NSQD_HTTP: 4151, LOOKUPD_TCP: 4160, LOOKUPD_HTTP: 4161}

#: what a client found at the address instead (``found``)
AN_HTTP_SERVER = "an HTTP server"
#: an answer that is no HTTP and no NSQ listener's known refusal
NOT_HTTP = "a server that does not speak HTTP"

#: the first bytes nsqd's and nsqlookupd's TCP listeners answer a stranger with
NSQD_BAD_PROTOCOL = b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"
LOOKUPD_BAD_PROTOCOL = b"\x00\x00\x00\x0eE_BAD_PROTOCOL"


def refusal_of(data: bytes) -> str | None:
    """Which NSQ TCP listener's ``E_BAD_PROTOCOL`` refusal ``data`` is, or begins (a read may
    stop anywhere in it, even after the 4-byte size): :data:`NSQD_TCP`, :data:`LOOKUPD_TCP`,
    or None."""
    for found, refusal in ((NSQD_TCP, NSQD_BAD_PROTOCOL), (LOOKUPD_TCP, LOOKUPD_BAD_PROTOCOL)):
        n = min(len(data), len(refusal))
        if n >= 4 and data[:n] == refusal[:n]:
            return found
    return None


def tcp_listener(data: bytes) -> str | None:
    """Which NSQ TCP listener starts its answer with ``data`` (:data:`NSQD_TCP`,
    :data:`LOOKUPD_TCP`), ``AN_HTTP_SERVER`` for an HTTP status line, None when it tells
    nothing (yet)."""
    if data.startswith(b"HTTP/"):
        return AN_HTTP_SERVER
    return refusal_of(data)


def port_name(kind: str) -> str:
    """``"nsqd TCP"`` → ``"nsqd's TCP port"``."""
    server, _, proto = kind.partition(" ")
    return f"{server}'s {proto} port"


def describe(expected: str, found: str, path: str = "") -> str:
    """The sentence saying what answered instead of ``expected`` and where to look."""
    usual = f"{port_name(expected)} is usually {DEFAULT_PORTS[expected]}"
    if found == AN_HTTP_SERVER:
        return (f"this looks like an HTTP port (nsqd's is usually 4151, nsqlookupd's 4161); "
                f"{usual}")
    if found in (NSQD_TCP, LOOKUPD_TCP) and expected == NSQD_TCP:
        return f"this looks like {port_name(found)} (it refused nsqd's protocol); {usual}"
    if found in (NSQD_TCP, LOOKUPD_TCP):
        return (f"this speaks the NSQ TCP protocol, not HTTP (it answered like "
                f"{port_name(found)}); {usual}")
    if found in DEFAULT_PORTS:
        return f"this looks like {port_name(found)} (it has no {path}); {usual}"
    return f"{found} answered; {usual}"


class WrongPortError(NSQError):
    """The address answered as another kind of listener than it was given as.

    ``address`` is the address as given, ``expected`` what it was given as (``"nsqd TCP"``,
    ``"nsqd HTTP"``, ``"nsqlookupd HTTP"``) and ``found`` what answered instead. Each concrete
    class is also the error its client raised before for that answer."""

    address: str
    expected: str
    found: str

    def _mark(self, address: str, expected: str, found: str) -> None:
        self.address = address
        self.expected = expected
        self.found = found


class NsqdTcpWrongPortError(ProtocolError, WrongPortError):
    """An nsqd TCP address (``nsqd=`` of a producer or consumer, a connection) answered the
    NSQ handshake as an HTTP server or as nsqlookupd's TCP port."""

    def __init__(self, address: str, found: str) -> None:
        super().__init__(f"nsqd {address} is not an nsqd TCP port: "
                         f"{describe(NSQD_TCP, found)}")
        self._mark(address, NSQD_TCP, found)


class NsqdHttpWrongPortError(NsqdUnavailableError, WrongPortError):
    """An nsqd HTTP address answered as an NSQ TCP port, or as an HTTP server without nsqd's
    paths (an nsqlookupd)."""

    def __init__(self, address: str, path: str, found: str, status: int | None) -> None:
        super().__init__(address, path,
                         f"not an nsqd HTTP port: {describe(NSQD_HTTP, found, path)}", status)
        self._mark(address, NSQD_HTTP, found)


class LookupdWrongPortError(LookupdError, WrongPortError):
    """An nsqlookupd HTTP address answered as an NSQ TCP port, or as an HTTP server without
    nsqlookupd's paths (an nsqd)."""

    def __init__(self, lookupd: str, path: str, found: str, status: int | None) -> None:
        super().__init__(f"not an nsqlookupd HTTP port: "
                         f"{describe(LOOKUPD_HTTP, found, path)}",
                         lookupd=lookupd, path=path, status=status)
        self._mark(lookupd, LOOKUPD_HTTP, found)
