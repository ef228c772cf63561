"""Pure flow control for consumers: RDY distribution, backoff, attempts and requeue delays.

No sockets, clocks or asyncio here: objects are fed events with the current time and return
actions for the consumer to execute (see :class:`RdyController`).
"""

from smartnsq.flow.attempts import AttemptPolicy, requeue_delay, should_give_up
from smartnsq.flow.backoff import (
    BackoffState,
    BackoffStrategy,
    ExponentialStrategy,
    FullJitterStrategy,
    Pause,
    Resume,
    Transition,
    exponential_backoff,
    full_jitter_backoff,
    strategy_from_config,
)
from smartnsq.flow.rdy import (
    Action,
    RdyController,
    ScheduleTimer,
    SendRdy,
    is_conn_starved,
    per_connection_target,
    rdy_update_due,
)

__all__ = [
    "Action",
    "AttemptPolicy",
    "BackoffState",
    "BackoffStrategy",
    "ExponentialStrategy",
    "FullJitterStrategy",
    "Pause",
    "RdyController",
    "Resume",
    "ScheduleTimer",
    "SendRdy",
    "Transition",
    "exponential_backoff",
    "full_jitter_backoff",
    "is_conn_starved",
    "per_connection_target",
    "rdy_update_due",
    "requeue_delay",
    "should_give_up",
    "strategy_from_config",
]
