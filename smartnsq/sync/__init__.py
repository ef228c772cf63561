"""Blocking facades of the asyncio clients, for scripts, web apps, workers and Spark
executors: the same constructors (``nsqd=`` / ``lookupd=``), the same lifecycle (``with``, or
``start()`` and ``stop()``; ``is_closed``) and the same results, with methods that block. The
clients run on a shared background thread; a process forked from one that used them makes
its own."""

from smartnsq.sync.consumer import Consumer, OrderedConsumer, ThreadMessage
from smartnsq.sync.producer import Producer

__all__ = ["Consumer", "OrderedConsumer", "Producer", "ThreadMessage"]
