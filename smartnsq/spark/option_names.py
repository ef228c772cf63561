"""The names of the ``nsq`` source's options, as shown in messages and docs (Spark hands
them over lower-cased). Its own module: the source's options module imports the sink's, and
the sink names a source option given to a write."""

from __future__ import annotations

__all__ = ["SOURCE_OPTION_NAMES", "WIRE_OPTION_NAMES"]

#: how the source and the sink reach a secured nsqd (TLS, compression, AUTH), named after
#: the command line's options (go-nsq's settings) in this connector's camelCase
WIRE_OPTION_NAMES: tuple[str, ...] = (
    "tls", "tlsRootCaFile", "tlsCert", "tlsKey", "tlsInsecureSkipVerify",
    "snappy", "deflate", "deflateLevel", "authSecret",
)

SOURCE_OPTION_NAMES: tuple[str, ...] = (
    "lookupd", "topic", "channel", "flavour",
    "startingOffsets", "startingTimestamp", "endingOffsets", "failOnDataLoss",
    "maxMessagesPerTrigger", "maxBytesPerTrigger", "minPartitions", "commitToChannel",
    "readTimeoutSeconds", "consume", "maxMessages", "maxWaitSeconds", "triggerWaitSeconds",
    "messageTimeoutSeconds", *WIRE_OPTION_NAMES,
)
