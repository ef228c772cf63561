"""The README's main job: a self-check of the wire codec on this machine.

It encodes every command family, decodes stock and youzan message layouts and trace replies
through the incremental frame decoder, and prints what it saw. (It grows into the
end-to-end demonstration on the embedded cluster as the client layers land.)
"""

from __future__ import annotations

import time

from smartnsq.protocol import (
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    FrameDecoder,
    MessageLayout,
    commands,
    decode_message,
    decode_trace_response,
    encode_frame,
    encode_message,
    encode_trace_response,
    youzan_id,
)


def main() -> None:
    stream = b"".join([
        encode_frame(FRAME_MESSAGE, encode_message(time.time_ns(), 1, b"%016x" % 1, b"stock")),
        encode_frame(FRAME_MESSAGE, encode_message(time.time_ns(), 2, youzan_id(7, 42),
                                                   b"ordered", offset=0, raw_size=41)),
        encode_frame(FRAME_RESPONSE, encode_trace_response(8, 42, 41, 44)),
    ])
    dec = FrameDecoder()
    frames = [f for i in range(0, len(stream), 3) for f in dec.feed(stream[i:i + 3])]
    stock = decode_message(frames[0].data)
    ordered = decode_message(frames[1].data, MessageLayout(position=True))
    trace = decode_trace_response(frames[2].data)
    print("smartnsq codec self-check")
    print(f"  PUB   -> {commands.pub('demo', b'hello', 0)!r}")
    print(f"  MPUB  -> {len(commands.mpub('demo', [b'a'] * 100))} bytes for 100 messages")
    print(f"  stock message: id={stock.id.decode()} attempts={stock.attempts} body={stock.body!r}")
    print(f"  youzan ordered message: internal id={ordered.internal_id} "
          f"trace id={ordered.trace_id} offset={ordered.offset} raw size={ordered.raw_size}")
    print(f"  PUB_TRACE receipt: {trace}")
    print("ok")


if __name__ == "__main__":
    main()
