"""The Grafana dashboard shipped in docs/grafana: a dashboard Grafana imports, whose every
query asks for metrics smartnsq exports (the catalog's names with the text format's suffixes)
by labels they have, and that shows every metric of the catalog somewhere."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smartnsq.metrics import Kind, MetricSpec
from smartnsq.metrics.catalog import ALL, PREFIX

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "smartnsq-dashboard.json"
#: labels Prometheus adds to every scraped series
TARGET_LABELS = {"instance", "job"}
_NAME = re.compile(rf"\b{PREFIX}_[a-z0-9_]+\b")
_VARIABLE = re.compile(r"\$\{?(\w+)")
#: a selector by name pattern (the variables' label_values over several metrics)
_BY_PATTERN = re.compile(r'__name__=~"([^"]+)"')


def exported() -> dict[str, tuple[MetricSpec, str]]:
    """Every sample name the Prometheus exporter writes -> (its spec, the suffix)."""
    out: dict[str, tuple[MetricSpec, str]] = {}
    for spec in ALL:
        base = f"{PREFIX}_{spec.name}"
        suffixes = {Kind.COUNTER: ("_total",), Kind.GAUGE: ("",),
                    Kind.HISTOGRAM: ("_bucket", "_sum", "_count")}[spec.kind]
        for suffix in suffixes:
            out[base + suffix] = (spec, suffix)
    return out


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", ())


def queries(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable."""
    for panel in panels(doc):
        for target in panel.get("targets", ()):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            yield f"variable {var['name']}", query["query"] if isinstance(query, dict) else query


def test_it_is_a_dashboard_grafana_imports() -> None:
    doc = load()
    assert doc["title"] and doc["uid"] and isinstance(doc["schemaVersion"], int)
    assert doc["time"]["from"].startswith("now-")
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(doc):
        pos = panel["gridPos"]
        assert {"x", "y", "w", "h"} <= set(pos) and pos["x"] >= 0 and pos["x"] + pos["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["id"]
        # every panel on the chosen Prometheus, never on one of the author's
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == panel["datasource"] and t["expr"].strip()
    # every variable a query uses is defined (Grafana's own start with __)
    for where, query in queries(doc):
        for name in _VARIABLE.findall(query):
            assert name.startswith("__") or name in variables, (where, name)


def metric_names(query: str, names: dict[str, tuple[MetricSpec, str]]) -> list[str]:
    """The metrics a query asks for: by name, or every exported name a ``__name__``
    pattern matches (a pattern that matches none fails)."""
    used = []
    for pattern in _BY_PATTERN.findall(query):
        matched = [n for n in names if re.fullmatch(pattern, n)]
        assert matched, f"{pattern!r} matches no exported metric"
        used += matched
    return used + _NAME.findall(_BY_PATTERN.sub("", query))


def test_every_query_asks_for_metrics_smartnsq_exports() -> None:
    names = exported()
    for where, query in queries(load()):
        used = metric_names(query, names)
        assert used, f"{where}: no smartnsq metric in {query!r}"
        for name in used:
            assert name in names, f"{where}: {name} is not exported (check the suffix)"


def test_every_catalog_metric_has_a_panel() -> None:
    doc = load()
    names = exported()
    shown = {names[n][0].name for where, q in queries(doc) if where.startswith("panel")
             for n in _NAME.findall(q) if n in names}
    assert sorted(s.name for s in ALL if s.name not in shown) == []
    # and the groups of the catalog each have their row
    rows = {p["title"] for p in doc["panels"] if p["type"] == "row"}
    assert {"Consumer", "Producer", "Lookup", "Spark"} <= rows


def _walk(node: Any, functions: tuple[str, ...], out: list[tuple[Any, tuple[str, ...]]]
          ) -> None:
    """Every vector selector with the functions around it; aggregations' grouping labels as
    ("by", labels)."""
    import promql_parser as pp

    if isinstance(node, pp.VectorSelector):
        out.append((node, functions))
    elif isinstance(node, pp.MatrixSelector):
        _walk(node.vector_selector, functions, out)
    elif isinstance(node, pp.Call):
        for arg in node.args:
            _walk(arg, (*functions, node.func.name), out)
    elif isinstance(node, pp.AggregateExpr):
        if node.modifier is not None:
            out.append((("by", tuple(node.modifier.labels)), functions))
        _walk(node.expr, functions, out)
        if node.param is not None:
            _walk(node.param, functions, out)
    elif isinstance(node, pp.BinaryExpr):
        _walk(node.lhs, functions, out)
        _walk(node.rhs, functions, out)
    elif isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        _walk(node.expr, functions, out)


def test_queries_parse_and_use_each_metric_as_its_type_allows() -> None:
    """Parsed with a PromQL parser: counters only under rate()/increase(), buckets only in
    histogram_quantile() with ``le`` kept, label matchers and groupings by labels the metric
    has."""
    import promql_parser as pp  # the dev extra's: this check never skips in CI
    names = exported()
    doc = load()
    for where, query in queries(doc):
        if where.startswith("variable"):
            continue  # label_values() is Grafana's, not PromQL (its names are checked above)
        # Grafana's interval variables are durations once Grafana expands them
        ast = pp.parse(re.sub(r"\$__(rate_interval|interval|range)", "5m", query))
        found: list[tuple[Any, tuple[str, ...]]] = []
        _walk(ast, (), found)
        labels: set[str] = set(TARGET_LABELS)
        for node, functions in found:
            if isinstance(node, tuple):
                continue
            spec, suffix = names[node.name]
            have = set(spec.labels) | TARGET_LABELS | ({"le"} if suffix == "_bucket" else set())
            labels |= have
            for m in node.matchers.matchers:
                assert m.name in have, f"{where}: {node.name} has no label {m.name!r}"
            if suffix in ("_total", "_bucket", "_sum", "_count"):
                assert functions and functions[-1] in ("rate", "increase"), (
                    f"{where}: {node.name} is a counter: rate() or increase() it")
            if suffix == "_bucket":
                assert functions[0] == "histogram_quantile", where
        for node, _ in found:
            if isinstance(node, tuple):
                assert set(node[1]) <= labels, f"{where}: grouping by {node[1]}"
        if "histogram_quantile" in query:
            assert any(isinstance(n, tuple) and "le" in n[1] for n, _ in found), (
                f"{where}: histogram_quantile needs the buckets grouped by le")
