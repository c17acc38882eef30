"""Whatever bytes land on a channel topic, decoding them never raises."""

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.channels.messages import decode, encode
from ackstream.records import ACK_RECORD_SCHEMA, COMPLETION_SCHEMA


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.sampled_from([ACK_RECORD_SCHEMA, COMPLETION_SCHEMA]))
def test_random_bytes_become_a_reason_never_an_exception(payload, schema):
    out = decode(payload, schema, "topo.acks", 0, 7)
    assert isinstance(out, pa.Table | str)
    if isinstance(out, str):
        assert out.startswith("message topo.acks[0]@7 is not ")


def test_a_truncated_or_bit_flipped_record_batch_is_reported():
    table = pa.Table.from_pylist([{"root": 1, "value": 2, "kind": 1}], schema=ACK_RECORD_SCHEMA)
    good = encode(table.to_batches()[0])
    assert decode(good, ACK_RECORD_SCHEMA, "t", 0, 0).num_rows == 1
    for bad in (good[: len(good) // 2], good[:8] + b"\xff" * 8 + good[16:], b"\xff" * 64):
        assert isinstance(decode(bad, ACK_RECORD_SCHEMA, "t", 0, 0), str)
