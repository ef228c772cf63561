"""Where a client finds nsqd: the one address vocabulary of every client.

Every client (:class:`~smartnsq.Producer`, :class:`~smartnsq.HttpProducer`,
:class:`~smartnsq.Consumer`, :class:`~smartnsq.OrderedConsumer` and the blocking facades in
:mod:`smartnsq.sync`) takes exactly one of

* ``nsqd=``: nsqd addresses, one ``"host:port"`` string or a sequence of them (TCP ports;
  the HTTP producer's are nsqd's HTTP ports);
* ``lookupd=``: nsqlookupd HTTP addresses, one string or a sequence, or a
  :class:`~smartnsq.lookup.Lookup` to share between clients (the client then neither starts
  nor stops it).

:func:`resolve_source` checks them the same way for every client and raises the same
:class:`~smartnsq.errors.ConfigError`, naming the client and what was wrong, before any I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from smartnsq.config import LookupConfig
from smartnsq.errors import ConfigError
from smartnsq.lookup import Lookup
from smartnsq.protocol.validation import parse_http_address, parse_tcp_address

__all__ = ["LookupdSpec", "NsqdSpec", "Source", "lookup_of", "resolve_source"]

#: what ``nsqd=`` accepts
NsqdSpec = str | Sequence[str]
#: what ``lookupd=`` accepts
LookupdSpec = str | Sequence[str] | Lookup


@dataclass(frozen=True, slots=True)
class Source:
    """A client's checked source: ``nsqd`` addresses, or ``lookupd`` addresses, or a shared
    ``lookup``; exactly one is set."""

    nsqd: tuple[str, ...] = ()
    lookupd: tuple[str, ...] = ()
    lookup: Lookup | None = None

    @property
    def direct(self) -> bool:
        """True when the client talks to listed nsqd (no lookup)."""
        return bool(self.nsqd)


def _addresses(value: object, name: str, client: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, bytes | bytearray) or not isinstance(value, Sequence):
        raise ConfigError(f"{client}: {name}= must be an address string or a sequence of "
                          f"them, got {type(value).__name__}")
    if not value:
        raise ConfigError(f"{client}: {name}= is empty: give at least one address")
    for a in value:
        if not isinstance(a, str):
            raise ConfigError(f"{client}: {name}= must hold address strings, got "
                              f"{type(a).__name__} {a!r}")
    return tuple(value)


def _check(addresses: tuple[str, ...], kind: Literal["tcp", "http"], name: str,
           client: str) -> None:
    parse: Callable[[str], object] = parse_tcp_address if kind == "tcp" else parse_http_address
    for a in addresses:
        try:
            parse(a)
        except ConfigError as exc:
            raise ConfigError(f"{client}: {name}=: {exc}") from None


def resolve_source(client: str, nsqd: object, lookupd: object, *,
                   nsqd_kind: Literal["tcp", "http"] = "tcp") -> Source:
    """Check a client's ``nsqd=`` / ``lookupd=`` (see the module docstring); ``client``
    names it in errors, ``nsqd_kind`` says which nsqd port its addresses are."""
    if (nsqd is None) == (lookupd is None):
        raise ConfigError(
            f"{client}: give nsqd= (nsqd addresses) or lookupd= (nsqlookupd HTTP addresses "
            f"or a Lookup), {'not both' if nsqd is not None else 'one of them'}")
    if nsqd is not None:
        addresses = _addresses(nsqd, "nsqd", client)
        _check(addresses, nsqd_kind, "nsqd", client)
        return Source(nsqd=addresses)
    if isinstance(lookupd, Lookup):
        return Source(lookup=lookupd)
    addresses = _addresses(lookupd, "lookupd", client)
    _check(addresses, "http", "lookupd", client)
    return Source(lookupd=addresses)


def lookup_of(source: Source, *, poll_interval: float, poll_jitter: float
              ) -> tuple[Lookup, bool]:
    """The :class:`Lookup` of a lookupd ``source`` and whether the client owns it (starts
    and stops it): a shared one is the caller's; addresses get a new one polled every
    ``poll_interval`` seconds (± ``poll_jitter``)."""
    if source.lookup is not None:
        return source.lookup, False
    if not source.lookupd:
        raise ConfigError("lookup_of() needs a lookupd source")
    return Lookup(LookupConfig(addresses=source.lookupd, poll_interval=poll_interval,
                               poll_jitter=poll_jitter)), True
