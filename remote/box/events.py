"""The reader that sends event files' new records raw: sent only to a poll that
reads event files without the decoder (bundle.RAW_RECORDS).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import sys

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])


RAW_CAP = 24 * 1024
"""Event-file bytes sent raw per poll, all files: a poll whose probe carries no
decoder (the client's steady state, modules_for) sends the new records as they are and the
client decodes them; more than this, and the next poll ships the decoder."""


def read_raw_records(entry, path, offset, size, budget):
    """The whole TFRecords from `offset` on, within RAW_CAP and the poll's byte budget, walked
    by their lengths alone (8-byte length, its 4-byte CRC, data, the data's 4-byte CRC): the
    client checks both CRCs and decodes them (remote/wire/raw_events.py) into what read_scalars
    would have given; nothing of a file read from 0 that is larger than that (a first load:
    the decoder, shipped next poll, reads it on the box). A record cut short at the end of the
    file stays for the next poll, as the decoder leaves it; its header goes as "head" so that
    the client can tell a live writer's record from a damaged length (which the decoder,
    shipped next, resynchronises over)."""
    import binascii

    cap = min(budget.setdefault("raw", RAW_CAP), budget["bytes"])
    data = b""
    if offset or size <= cap:  # a first load larger than that: the decoder, next poll
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(max(0, min(cap, size - offset)))
    n = len(data)
    pos = stopped = 0
    while not stopped:
        if pos + 12 > n:
            stopped = "bytes" if offset + n < size else "partial" if pos < n else "eof"
            continue
        end = pos + 16 + int.from_bytes(data[pos:pos + 8], "little")
        if end > n:
            stopped = "partial" if offset + end > size else "bytes"
        else:
            pos = end
    budget["raw"] -= pos
    budget["bytes"] -= pos
    entry.update({"start": offset, "offset": offset + pos, "stopped": stopped,
                  "raw": binascii.b2a_base64(data[:pos], newline=False).decode()})
    if stopped == "partial" and pos + 12 <= n:
        entry["head"] = binascii.b2a_base64(data[pos:pos + 12], newline=False).decode()
    return entry


