"""The top-level package exposes the small public API ARCHITECTURE.md describes."""

from __future__ import annotations

import subprocess
import sys

import pytest

import smartnsq


def test_every_public_name_resolves() -> None:
    for name in smartnsq.__all__:
        assert getattr(smartnsq, name) is not None, name


def test_lazy_names_are_the_real_classes() -> None:
    from smartnsq.consumer import Consumer
    from smartnsq.message import Message
    from smartnsq.ordered import OrderedConsumer, OrderedProducer
    from smartnsq.producer import Producer

    assert smartnsq.Producer is Producer
    assert smartnsq.Consumer is Consumer
    assert smartnsq.Message is Message
    assert smartnsq.OrderedConsumer is OrderedConsumer
    assert smartnsq.OrderedProducer is OrderedProducer


def test_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        smartnsq.Nope  # noqa: B018


def test_import_is_light() -> None:
    # importing the package must not pull in the client stack (aiohttp, the producer ...)
    code = ("import sys, smartnsq; "
            "print(any(m.startswith(('smartnsq.producer', 'smartnsq.consumer', 'aiohttp')) "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"
