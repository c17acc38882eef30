"""Whatever bytes land on a channel topic, decoding them never raises."""

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.channels.messages import decode, encode
from ackstream.vocabulary.records import ACK_RECORD_SCHEMA, COMPLETION_SCHEMA


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


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=0, max_value=3_000),
    st.integers(min_value=0, max_value=600),
    st.sampled_from([6_000, 20_000, 200_000]),
)
def test_a_table_of_any_size_is_cut_into_messages_within_the_budget(rows, reason, budget):
    """However many completions a batch has and however long their reasons, each message
    fits the budget and together they hold every row once, in order."""
    from ackstream.channels.messages import encode_within

    table = pa.Table.from_pylist(
        [{"root": i, "status": "failed", "reason": f"{i}:" + "x" * reason} for i in range(rows)],
        schema=COMPLETION_SCHEMA,
    )
    messages = encode_within(table, budget)
    assert all(len(message) <= budget for _, message in messages)
    back = [decode(message, COMPLETION_SCHEMA, "t", 0, 0) for _, message in messages]
    assert pa.concat_tables([COMPLETION_SCHEMA.empty_table(), *back]).equals(table)
    assert [part.num_rows for part, _ in messages] == [part.num_rows for part in back]


def test_one_record_over_the_budget_is_named_not_sent():
    import pytest

    from ackstream.channels.messages import MessageTooLarge, encode_within

    table = pa.Table.from_pylist(
        [{"root": 1, "status": "failed", "reason": "é" * 4000}], schema=COMPLETION_SCHEMA
    )
    with pytest.raises(MessageTooLarge, match="over the 500 bytes"):
        encode_within(table, 500)


def test_a_table_of_many_small_chunks_is_one_record_batch_in_its_message():
    """A batch's completions come concatenated from many small tables (a replayed
    record's each): they travel as one record batch, not one per piece."""
    from ackstream.channels.messages import encode, encode_within

    pieces = [
        pa.Table.from_pylist([{"root": i, "status": "acked"}], schema=COMPLETION_SCHEMA)
        for i in range(1_000)
    ]
    table = pa.concat_tables(pieces)
    ((rows, message),) = encode_within(table)
    assert rows.num_rows == 1_000
    assert len(list(pa.ipc.open_stream(message))) == 1
    assert len(message) == len(encode(table.combine_chunks()))
