"""Access to the bytes recorded from real servers (../shared/captures beside the repo)."""

from __future__ import annotations

from pathlib import Path

import pytest

CAPTURES = Path(__file__).resolve().parents[1].parent / "shared" / "captures"


def capture(name: str) -> bytes:
    """The bytes of ``stock/...`` or ``youzan/...``; skips the test when not present."""
    path = CAPTURES / name
    if not path.is_file():
        pytest.skip(f"capture {name} not available")
    return path.read_bytes()


def capture_frame(name: str) -> tuple[int, bytes]:
    """A single captured frame as (type, data)."""
    from smartnsq.protocol import FrameDecoder

    frames = FrameDecoder().feed(capture(name))
    assert len(frames) == 1, f"{name} holds {len(frames)} frames"
    return frames[0].type, frames[0].data
