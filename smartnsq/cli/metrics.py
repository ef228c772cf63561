"""``--metrics-port`` / ``--metrics-addr`` of the long-running commands (``tail``,
``to-file``, ``bridge``): while the command runs, its clients report to a
:class:`~smartnsq.metrics.prometheus.PrometheusMetrics` served over HTTP in Prometheus text.

The exporter becomes the process default (:func:`smartnsq.metrics.set_metrics`) before any
client starts, so the command's consumers and producers report without being told; the
previous default is back and the port closed when the command ends. The line
``smartnsq: metrics on http://HOST:PORT/metrics`` on stderr says where (port 0 picks a free
port, which that line names).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from smartnsq.cli.common import CliError, err_print

T = TypeVar("T")

INSTALL_HINT = "pip install 'smartnsq[prometheus]'"


def metrics_options(fn: Callable[..., T]) -> Callable[..., T]:
    """Add ``--metrics-port`` and ``--metrics-addr`` to a command (put it between the click
    options and :func:`~smartnsq.cli.stopping.command_runner`): the command runs inside
    :func:`serving_metrics`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, metrics_port: int | None, metrics_addr: str, **kwargs: Any) -> T:
        with serving_metrics(metrics_port, metrics_addr):
            return fn(*args, **kwargs)

    wrapper = click.option(
        "--metrics-addr", default="127.0.0.1", show_default=True, metavar="HOST",
        help="the address --metrics-port listens on (0.0.0.0: every interface)")(wrapper)
    return click.option(
        "--metrics-port", type=click.IntRange(0, 65535), metavar="PORT",
        help="serve the clients' metrics for Prometheus on http://HOST:PORT/metrics while "
             f"running (0: a free port, named on stderr; needs {INSTALL_HINT})")(wrapper)


@contextlib.contextmanager
def serving_metrics(port: int | None, addr: str = "127.0.0.1") -> Iterator[None]:
    """With a ``port``: a Prometheus exporter as the process default, served on
    ``addr:port`` for the duration; without one, nothing."""
    if port is None:
        yield
        return
    try:
        from prometheus_client import (
            GC_COLLECTOR,
            PLATFORM_COLLECTOR,
            PROCESS_COLLECTOR,
            CollectorRegistry,
        )

        from smartnsq.metrics import set_metrics
        from smartnsq.metrics.prometheus import PrometheusMetrics
    except ImportError:
        raise CliError(f"--metrics-port needs prometheus_client: {INSTALL_HINT}") from None
    # a registry of the command's own (in-process callers, such as tests, run commands more
    # than once), with the process, platform and GC figures prometheus_client's default
    # registry has
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    metrics = PrometheusMetrics(registry)
    try:
        server, thread = metrics.serve(port, addr)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise CliError(f"--metrics-port {port}: cannot listen on {_join(addr, port)}: "
                       f"{why}") from None
    err_print(f"smartnsq: metrics on http://{_join(addr, server.server_port)}/metrics")
    previous = set_metrics(metrics)
    try:
        yield
    finally:
        set_metrics(previous)
        server.shutdown()
        server.server_close()
        thread.join(5.0)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
