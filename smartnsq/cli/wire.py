"""How the commands reach a secured nsqd: ``--tls`` and its files, ``--snappy`` /
``--deflate``, ``--auth-secret``, one definition for every command that connects.

* :func:`tcp_wire_options` (``publish``, ``tail``, ``to-file``; ``bridge`` once per side,
  ``--from-…`` / ``--to-…``): the TLS upgrade, compression and AUTH of its TCP connections,
  which :func:`connection_config` turns into the clients' ``ConnectionConfig``.
* :func:`http_wire_options` (``stat``, ``topic …``, ``channel …``): the TLS options only,
  for nsqd's HTTPS API, given as ``--nsqd https://HOST:PORT`` (nsqd's ``--https-address``;
  the lookupds announce only its plain HTTP port). :func:`nsqd_http_client` makes the
  command's HTTP client with them.

The names are go-nsq's settings (``tls_v1``, ``tls_root_ca_file``, ``tls_cert``,
``tls_key``, ``tls_insecure_skip_verify``, ``snappy``, ``deflate``, ``deflate_level``,
``auth_secret``) as nsq_tail's ``--consumer-opt`` takes them, and nsqd's own ``--tls-…``
flags. Any TLS file turns TLS on. The secret is read from ``SMARTNSQ_AUTH_SECRET``
(``SMARTNSQ_FROM_AUTH_SECRET`` / ``SMARTNSQ_TO_AUTH_SECRET``) when the option is not given
(a command line shows in ``ps``), and never printed. Wrong combinations are usage errors
naming the option (exit code 2), before anything connects.

The settings hold for the command's run in a context variable: the commands build their
clients' configurations, and their HTTP clients, deep in helpers.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click

from smartnsq.cli.common import one_line

if TYPE_CHECKING:
    from smartnsq.config import ConnectionConfig
    from smartnsq.nsqd_http import NsqdHttpClient
    from smartnsq.wire_settings import Setting, WireSettings

T = TypeVar("T")

_FILE = click.Path(exists=True, dir_okay=False, readable=True)

_WIRES: contextvars.ContextVar[dict[str, WireSettings]] = contextvars.ContextVar(
    "smartnsq_cli_wires")


def current_wire(prefix: str = "") -> WireSettings:
    """The running command's settings for the side ``prefix`` names (``from-``, ``to-``)."""
    wire = _WIRES.get({}).get(prefix)
    if wire is None:
        from smartnsq.wire_settings import WireSettings

        wire = WireSettings()
    return wire


def connection_config(prefix: str = "", **fields: Any) -> ConnectionConfig:
    """A ``ConnectionConfig`` with ``fields`` and the command's TLS, compression and AUTH."""
    return current_wire(prefix).connection(**fields)


def nsqd_http_client(*, timeout: float = 5.0) -> NsqdHttpClient:
    """The command's nsqd HTTP client: ``https://`` addresses use its TLS options."""
    from smartnsq.nsqd_http import NsqdHttpClient

    return NsqdHttpClient(timeout=timeout, tls=current_wire().tls)


@contextlib.contextmanager
def _holding(prefix: str, wire: WireSettings) -> Iterator[None]:
    token = _WIRES.set({**_WIRES.get({}), prefix: wire})
    try:
        yield
    finally:
        _WIRES.reset(token)


def _name(prefix: str, option: str) -> str:
    return f"--{prefix}{option}"


def _key(prefix: str, option: str) -> str:
    return f"{prefix}{option}".replace("-", "_")


def _settings(prefix: str, kw: dict[str, Any], *, tcp: bool) -> WireSettings:
    """The wire options of ``kw`` (removed from it), checked by the one set of rules
    (:mod:`smartnsq.wire_settings`); a usage error names the option at fault."""
    from smartnsq.wire_settings import wire_settings

    def take(option: str) -> Any:
        return kw.pop(_key(prefix, option))

    names: dict[Setting, str] = {s: _name(prefix, o) for s, o in _OPTIONS.items()}

    def refuse(setting: Setting, why: str) -> click.UsageError:
        return click.UsageError(f"{names[setting]} {one_line(why)}")

    tls = dict(tls=take("tls") or None, ca=take("tls_root_ca_file"), cert=take("tls_cert"),
               key=take("tls_key"), insecure=take("tls_insecure_skip_verify"))
    if not tcp:
        return wire_settings(names, refuse, **tls)
    return wire_settings(names, refuse, **tls, snappy=take("snappy"), deflate=take("deflate"),
                         level=take("deflate_level"), secret=take("auth_secret"))


#: each setting's option (before a side's prefix)
_OPTIONS: dict[Setting, str] = {
    "tls": "tls", "ca": "tls-root-ca-file", "cert": "tls-cert", "key": "tls-key",
    "insecure": "tls-insecure-skip-verify", "snappy": "snappy", "deflate": "deflate",
    "level": "deflate-level", "secret": "auth-secret"}


def _tls_options(prefix: str, what: str) -> list[Callable[[Any], Any]]:
    n = functools.partial(_name, prefix)
    return [
        click.option(n("tls"), _key(prefix, "tls"), is_flag=True,
                     help=f"{what}; any {n('tls-…')} option turns it on"),
        click.option(n("tls-root-ca-file"), _key(prefix, "tls_root_ca_file"), type=_FILE,
                     metavar="FILE", help="CA certificates (PEM) that verify nsqd's certificate "
                                          "(default: the system's)"),
        click.option(n("tls-cert"), _key(prefix, "tls_cert"), type=_FILE, metavar="FILE",
                     help="client certificate (PEM), for an nsqd that requires one; it may "
                          "hold the key too"),
        click.option(n("tls-key"), _key(prefix, "tls_key"), type=_FILE, metavar="FILE",
                     help=f"the key of {n('tls-cert')}, when it is a file of its own"),
        click.option(n("tls-insecure-skip-verify"), _key(prefix, "tls_insecure_skip_verify"),
                     is_flag=True, help="do not verify nsqd's certificate (testing only)"),
    ]


def _apply(fn: Callable[..., T], options: list[Callable[[Any], Any]]) -> Callable[..., T]:
    for option in reversed(options):
        fn = option(fn)
    return fn


def http_wire_options(fn: Callable[..., T]) -> Callable[..., T]:
    """Add the TLS options to a command that uses nsqd's HTTP API (put it between the
    click options and :func:`~smartnsq.cli.stopping.command_runner`). They apply to
    ``https://`` addresses, so without one they are refused rather than left unused."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        from smartnsq.protocol.validation import is_https_address

        wire = _settings("", kwargs, tcp=False)
        nsqd: tuple[str, ...] = kwargs.get("nsqd", ())
        if wire.tls is not None and not any(map(is_https_address, nsqd)):
            raise click.UsageError(
                "--tls and its files apply to nsqd's HTTPS API: give --nsqd "
                "https://HOST:PORT (nsqd's --https-address; the lookupds announce only its "
                "plain HTTP port)")
        with _holding("", wire):
            return fn(*args, **kwargs)

    return _apply(wrapper, _tls_options(
        "", "HTTPS to nsqd, verified with the options below: give --nsqd https://HOST:PORT "
            "(nsqd's --https-address)"))


def tcp_wire_options(prefix: str = "", side: str = "nsqd"
                     ) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Add TLS, compression and AUTH options to a command whose clients connect over TCP
    (between the click options and ``command_runner``); ``prefix`` names a second side
    (``from-``), ``side`` says in the help which nsqd they are for."""
    env = f"SMARTNSQ_{prefix.replace('-', '_').upper()}AUTH_SECRET"
    n = functools.partial(_name, prefix)

    def deco(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            with _holding(prefix, _settings(prefix, kwargs, tcp=True)):
                return fn(*args, **kwargs)

        return _apply(wrapper, [
            *_tls_options(prefix, f"TLS to {side} (the connections' upgrade; nsqd "
                                   "--tls-cert)"),
            click.option(n("snappy"), _key(prefix, "snappy"), is_flag=True,
                         help="snappy-compress the connections (nsqd --snappy)"),
            click.option(n("deflate"), _key(prefix, "deflate"), is_flag=True,
                         help="deflate-compress the connections (nsqd --deflate)"),
            click.option(n("deflate-level"), _key(prefix, "deflate_level"),
                         type=click.IntRange(1, 9), metavar="1-9",
                         help="deflate level (default 6; nsqd lowers it to its "
                              "--max-deflate-level)"),
            click.option(n("auth-secret"), _key(prefix, "auth_secret"), envvar=env,
                         show_envvar=True, metavar="SECRET",
                         help=f"AUTH secret for an nsqd with --auth-http-address; prefer {env} "
                              "(a command line shows in ps)"),
        ])

    return deco
