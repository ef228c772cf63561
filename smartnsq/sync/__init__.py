"""Blocking facades: the asyncio clients run on a shared background thread."""

from smartnsq.sync.consumer import Consumer, ThreadMessage
from smartnsq.sync.producer import Producer

__all__ = ["Consumer", "Producer", "ThreadMessage"]
