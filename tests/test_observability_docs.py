"""The observability guide (docs/guides/observability.md) documents what the code has: a row
for every metric of the catalog with its type, labels and OpenTelemetry name, every label,
every span attribute key, the command-line flags that exist, and the Grafana dashboard. Its
examples run in tests/test_doc_examples.py."""

from __future__ import annotations

import re
from pathlib import Path

import click

from smartnsq.cli.app import cli
from smartnsq.metrics import Kind, MetricSpec
from smartnsq.metrics.catalog import ALL, LABELS, PREFIX
from smartnsq.tracing import semconv

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guides" / "observability.md"


def text() -> str:
    return PAGE.read_text()


def rows() -> dict[str, list[str]]:
    """Table rows whose first cell is a metric name in code -> their cells."""
    out: dict[str, list[str]] = {}
    for line in text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(rf"`{PREFIX}_\w+`", cells[0]):
            out[cells[0].strip("`")] = cells
    return out


def exposed(spec: MetricSpec) -> str:
    return f"{PREFIX}_{spec.name}" + ("_total" if spec.kind is Kind.COUNTER else "")


def test_every_catalog_metric_has_its_row() -> None:
    table = rows()
    for spec in ALL:
        cells = table.get(exposed(spec))
        assert cells is not None, f"no row for {exposed(spec)}"
        _, kind, labels, otel, meaning = cells
        assert kind == spec.kind.value, spec.name
        assert re.findall(r"`(\w+)`", labels) == list(spec.labels), spec.name
        assert otel == f"`{spec.otel_name}` ({spec.otel_unit})", spec.name
        assert len(meaning) > 20, spec.name
    # and no row for a metric that does not exist
    assert sorted(table) == sorted(exposed(s) for s in ALL)


def test_every_label_and_span_attribute_is_explained() -> None:
    page = text()
    for label in LABELS:
        assert f"| `{label}` |" in page, label
    keys = [v for k, v in vars(semconv).items() if k.isupper() and k != "SYSTEM_NSQ"
            and isinstance(v, str)]
    assert keys
    for key in keys:
        assert f"`{key}" in page, key


def _options(command: str) -> set[str]:
    # through the group: its commands load on first use (cli.commands holds only those
    # another test has loaded already)
    cmd = cli.get_command(click.Context(cli), command)
    assert cmd is not None, command
    return {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts}


def test_the_command_line_flags_it_names_exist() -> None:
    page = text()
    for command in ("tail", "to-file", "bridge"):
        assert {"--metrics-port", "--metrics-addr"} <= _options(command), command
        assert f"`smartnsq {command}`" in page
    assert "--client-metrics" in _options("stat")
    for flag in ("--metrics-port", "--metrics-addr", "--client-metrics"):
        assert flag in page


def test_the_dashboard_is_linked_and_the_page_is_in_the_navigation() -> None:
    links = re.findall(r"\]\(([^)]+\.json)\)", text())
    assert links == ["../grafana/smartnsq-dashboard.json"]
    assert (PAGE.parent / links[0]).resolve().is_file()
    nav = (ROOT / "mkdocs.yml").read_text().partition("\nnav:\n")[2]
    for page in ("guides/observability.md", "reference/metrics.md", "reference/tracing.md"):
        assert re.search(rf"^\s+- [^:]+: {page}$", nav, re.M), page
