"""Blocking facades: the asyncio clients run on a shared background thread."""

from smartnsq.sync.producer import Producer

__all__ = ["Producer"]
