"""The names of the ``nsq`` source's options, as shown in messages and docs (Spark hands
them over lower-cased). Its own module: the source's options module imports the sink's, and
the sink names a source option given to a write."""

from __future__ import annotations

__all__ = ["SOURCE_OPTION_NAMES"]

SOURCE_OPTION_NAMES: tuple[str, ...] = (
    "lookupd", "topic", "channel", "flavour",
    "startingOffsets", "startingTimestamp", "endingOffsets", "failOnDataLoss",
    "maxMessagesPerTrigger", "maxBytesPerTrigger", "minPartitions", "commitToChannel",
    "readTimeoutSeconds", "consume", "maxMessages", "maxWaitSeconds", "triggerWaitSeconds",
    "messageTimeoutSeconds",
)
