"""The consumer: discovery, subscriptions, RDY flow control, handler dispatch, stop, stats."""

from smartnsq.consumer.consumer import Consumer, GivingUpCallback, Handler, StartAt
from smartnsq.consumer.discovery import (
    DirectDiscovery,
    Discovery,
    Endpoint,
    LookupDiscovery,
    Topology,
)
from smartnsq.consumer.stats import ConsumerStats, SubscriptionStats
from smartnsq.message import Message

__all__ = [
    "Consumer",
    "ConsumerStats",
    "DirectDiscovery",
    "Discovery",
    "Endpoint",
    "GivingUpCallback",
    "Handler",
    "LookupDiscovery",
    "Message",
    "StartAt",
    "SubscriptionStats",
    "Topology",
]
