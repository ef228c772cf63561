"""A griffe extension for the API reference: smartnsq's docstrings use Sphinx roles
(``:class:`Producer```, ``:meth:`~smartnsq.Producer.publish```), which Markdown would show
verbatim. Each role becomes an optional cross-reference: a link when the reference documents
the target, plain code when it does not (an internal module), never a build warning."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`(?P<target>[^`]+)`")


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as seen from ``obj``'s scope (best effort)."""
    head, dot, rest = target.partition(".")
    if head == "smartnsq":
        return target
    try:
        return obj.resolve(head) + dot + rest
    except (griffe.NameResolutionError, AttributeError):
        return target


def _rewrite(obj: griffe.Object, text: str) -> str:
    def one(match: re.Match[str]) -> str:
        target = match["target"].strip().removesuffix("()")
        short = target.startswith("~")
        target = target.lstrip("~.")
        title = target.rsplit(".", 1)[-1] if short else target
        return (f'<autoref identifier="{_resolve(obj, target)}" optional>'
                f"<code>{title}</code></autoref>")

    return _ROLE.sub(one, text)


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj, obj.docstring.value)
        for member in obj.members.values():
            if isinstance(member, griffe.Object):   # aliases: their targets are walked
                self._walk(member, seen)
