"""Test your own NSQ code against an embedded cluster: a pytest plugin and what it gives.

Installing smartnsq registers the pytest plugin :mod:`smartnsq.testing.plugin` (entry point
``smartnsq``), so tests ask for its fixtures by name with nothing to import::

    def test_publish(nsq_stock):
        nsq_stock.create_topic("orders", channels=["billing"])
        with smartnsq.sync.Producer(nsqd=nsq_stock.nsqd_tcp_addresses) as producer:
            producer.publish("orders", b"hello")
        assert nsq_stock.message_count("orders") == 1

``nsq_stock`` and ``nsq_youzan`` (function scope), ``nsq_stock_session`` and
``nsq_youzan_session`` (session scope) and ``nsq_cluster_factory`` each give an
:class:`NsqCluster`; ``@pytest.mark.nsq(nodes=..., lookupds=...)`` sizes the cluster of one
test. Importing this package does not import pytest; :class:`NsqCluster` also works on its
own (``with NsqCluster("youzan") as nsq:``).
"""

from smartnsq.testing.cluster import ClusterFactory, NsqCluster

__all__ = ["ClusterFactory", "NsqCluster"]
