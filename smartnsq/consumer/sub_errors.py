"""Which errors met while subscribing end the consumer, and which are retried.

A subscription is opened by connecting, IDENTIFY (and AUTH), then SUB, SUB_ORDERED or
SUB_ADVANCED (:mod:`smartnsq.consumer.subscriptions`). What fails there goes to
:func:`ends_consumer`: an error that reconnecting cannot fix (a configuration the server
refuses: ordered/ext/channel mismatches, stock nsqd asked for youzan features, bad names,
auth refused, IDENTIFY settings refused, a server certificate that does not verify; the
last three are retried once the consumer has subscribed) stops the consumer, which keeps it
as ``Consumer.error`` and raises it from ``start()`` and ``wait_closed()``; everything else
(connection refused or lost, a leader that moved, E_TOPIC_NOT_EXIST, too many connections)
is retried with backoff by :class:`~smartnsq.consumer.conns.ConnectionSet`. The errors'
wording is their own (:mod:`smartnsq.errors`); the server's description is kept in each.
"""

from __future__ import annotations

import ssl

from smartnsq.errors import (
    AuthDisabledError,
    AuthFailedError,
    BadBodyError,
    BadChannelError,
    BadPartitionError,
    BadTopicError,
    ConfigError,
    InvalidError,
    SubChannelNotRegisteredError,
    SubExtendForbiddenError,
    SubExtendNeedError,
    SubOrderIsMustError,
    TLSError,
    UnauthorizedError,
    UnsupportedFeatureError,
)

__all__ = ["ENDS_CONSUMER", "RETRIED_ONCE_SUBSCRIBED", "ends_consumer"]

#: errors that reconnecting cannot fix: the consumer stops and reports them
ENDS_CONSUMER: tuple[type[BaseException], ...] = (
    ConfigError, UnsupportedFeatureError, SubOrderIsMustError, SubExtendNeedError,
    SubExtendForbiddenError, SubChannelNotRegisteredError, BadTopicError, BadChannelError,
    BadPartitionError, InvalidError, AuthFailedError, UnauthorizedError, AuthDisabledError,
)


#: of those, the ones retried once the consumer has subscribed: nsqd answers an auth server
#: it cannot reach with the same E_AUTH_FAILED as an unknown secret, and a secret accepted
#: before is no configuration mistake (a reconnect during an auth server's restart ended the
#: consumer for good)
RETRIED_ONCE_SUBSCRIBED: tuple[type[BaseException], ...] = (AuthFailedError,)


def _identify_refused(exc: BaseException) -> bool:
    """nsqd refused this client's IDENTIFY settings (E_BAD_BODY "IDENTIFY ...", e.g. a
    ``msg_timeout`` above its --max-msg-timeout): every reconnect is refused the same way.
    Once subscribed it is retried: one nsqd configured apart should not end the consumer."""
    return isinstance(exc, BadBodyError) and exc.text.startswith("IDENTIFY ")


def _certificate_refused(exc: BaseException) -> bool:
    """nsqd's certificate did not verify (a wrong CA, an expired or misnamed certificate):
    every reconnect meets the same certificate. Not other TLS failures (a connection reset
    during the handshake is a network problem). Once subscribed it is retried: a
    certificate replaced while consumers run is the server's to fix."""
    return isinstance(exc, TLSError) and isinstance(exc.__cause__, ssl.SSLCertVerificationError)


def ends_consumer(exc: BaseException, subscribed: bool = False) -> bool:
    """True when ``exc``, met while subscribing, stops the consumer; False when the
    subscription is retried. ``subscribed``: a subscription of this consumer was opened
    before."""
    if subscribed:
        return isinstance(exc, ENDS_CONSUMER) and not isinstance(exc, RETRIED_ONCE_SUBSCRIBED)
    return isinstance(exc, ENDS_CONSUMER) or _identify_refused(exc) or _certificate_refused(exc)
