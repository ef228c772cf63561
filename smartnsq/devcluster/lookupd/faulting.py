"""The ways an nsqlookupd double can be made to misbehave, for client robustness tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

LookupdFaultKind = Literal["refuse", "hang", "500", "malformed", "wrong_types", "delay"]
LOOKUPD_FAULT_KINDS: tuple[str, ...] = get_args(LookupdFaultKind)


@dataclass(frozen=True)
class LookupdFault:
    """An active lookupd fault.

    * ``refuse``: the listening socket is closed (connects are refused) and open connections
      are dropped; clearing the fault binds the same port again.
    * ``hang``: requests are read but never answered; clearing the fault drops them.
    * ``500``: every request gets HTTP 500 in the envelope the client negotiated.
    * ``malformed``: HTTP 200 with the right headers and a truncated, unparsable JSON body.
    * ``wrong_types``: HTTP 200 with valid JSON whose values have the wrong JSON types.
    * ``delay``: every response is held back ``seconds`` before it is sent.
    """

    kind: LookupdFaultKind
    seconds: float = 0.0


def check_lookupd_fault(kind: str, seconds: float) -> LookupdFault:
    if kind not in LOOKUPD_FAULT_KINDS:
        raise ValueError(f"unknown lookupd fault {kind!r}; expected one of {LOOKUPD_FAULT_KINDS}")
    if kind == "delay" and not seconds > 0:
        raise ValueError("the delay fault needs seconds > 0")
    if seconds < 0:
        raise ValueError("seconds must not be negative")
    return LookupdFault(kind, float(seconds))  # type: ignore[arg-type]


def scramble_types(value: Any) -> Any:
    """The same document with every value turned into another JSON type (keys kept).

    Objects keep their keys so a client finds what it looks for, with the wrong type: arrays
    become objects, strings numbers, numbers strings, booleans strings, null an empty array.
    """
    if isinstance(value, dict):
        return {k: scramble_types(v) for k, v in value.items()}
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return len(value)
    return []
