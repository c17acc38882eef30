"""The batch offset's JSON: what it writes reads back the same, offsets written before the
type read alike, and what it cannot read is refused naming the version or the field."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackstream.vocabulary.batch_offset import (
    BatchOffset,
    BatchOffsetError,
    Position,
    Tracked,
)

topics = st.sampled_from(["a", "b", "events.in"])
partitions = st.tuples(topics, st.integers(0, 40))
offsets = st.integers(0, 2**53)
spans = st.tuples(offsets, offsets).map(sorted).map(tuple)
runs = st.tuples(topics, st.integers(0, 40), offsets, st.integers(1, 1000), st.integers(0, 9)).map(
    lambda r: (r[0], r[1], r[2], r[2] + r[3], r[4])
)
names = st.text(min_size=1, max_size=12)
tracked = st.builds(
    Tracked,
    topology=names,
    channel=names,
    timeout_ms=st.integers(1, 10**9),
    namespace=names,
    seq=st.integers(0, 10**6),
    counts=st.dictionaries(st.sampled_from(["acked", "failed", "replayed"]), st.integers(0, 10**9)),
    rounds=st.none() | st.just({"round": [[1, 1]], "size": [[1, 4]], "flying": 1}),
)
batch_offsets = st.builds(
    BatchOffset,
    parts=st.dictionaries(partitions, st.builds(Position, offsets, offsets)),
    done=st.integers(-1, 10**9),
    owner=st.none() | names,
    read=st.dictionaries(partitions, spans),
    replays=st.lists(runs, max_size=5).map(tuple),
    idle_ms=st.none() | st.integers(0, 2**41),
    spark_reads_new=st.booleans(),
    spark_reads_replays=st.booleans(),
    tracked=st.none() | tracked,
)


@given(batch_offsets)
def test_an_offset_reads_back_from_its_json_text_as_it_was_written(offset):
    """Spark logs the JSON as text and hands it back parsed: partition numbers as strings."""
    text = json.dumps(offset.to_json())
    assert BatchOffset.from_json(text) == offset
    assert BatchOffset.from_json(json.loads(text)) == offset


def test_a_tracked_offset_written_before_the_type_reads_with_its_fields():
    logged = (
        '{"v": 1, "parts": {"events": {"0": {"end": 10, "wm": 4}, "1": {"end": 7, "wm": 7}}}, '
        '"read": {"events": {"0": [5, 10], "1": [7, 7]}}, "replays": [["events", 0, 2, 1]], '
        '"done": 42, "owner": "q-1", "reader": "spark", "seq": 3, "counts": {"acked": 5}, '
        '"source": "words", "ids": "words", "channel": "kafka", "timeout": 30000, '
        '"rounds": {"round": [[1, 1]], "size": [[1, 2]], "failed": [], "children": [], '
        '"systematic": [], "flying": 1}}'
    )
    offset = BatchOffset.from_json(logged)
    assert offset.parts == {("events", 0): Position(10, 4), ("events", 1): Position(7, 7)}
    assert offset.new_ranges() == [("events", 0, 5, 10)]  # an empty range reads nothing
    assert offset.replays == (("events", 0, 2, 3, 1),)  # one offset, as logged then: a run
    assert (offset.new_records, offset.replayed_records) == (5, 1)
    assert (offset.done, offset.owner) == (42, "q-1")
    assert offset.spark_reads_new and not offset.spark_reads_replays
    assert offset.tracked == Tracked(
        "words", "kafka", 30_000, "words", 3, {"acked": 5}, json.loads(logged)["rounds"]
    )
    assert offset.namespace == "words"


def test_the_kafka_channel_s_position_is_kept_as_the_channel_wrote_it():
    """The Kafka channel's position is its own JSON, a next offset per partition of its
    topic (the channel reads the partition numbers back from their strings)."""
    logged = {"v": 1, "parts": {}, "done": {"0": 12, "1": 3}}
    offset = BatchOffset.from_json(logged)
    assert offset.done == {"0": 12, "1": 3}
    assert BatchOffset.from_json(json.dumps(offset.to_json())) == offset
    with pytest.raises(BatchOffsetError, match="field 'done' is malformed"):
        BatchOffset.from_json({"v": 1, "parts": {}, "done": "12"})


def test_an_untracked_initial_offset_written_before_the_type_reads_with_its_fields():
    offset = BatchOffset.from_json(
        {"v": 1, "parts": {"t": {"0": {"end": 3, "wm": 3}}}, "replays": [], "done": -1}
    )
    assert offset == BatchOffset({("t", 0): Position(3, 3)})
    assert offset.tracked is None and offset.namespace is None and offset.new_ranges() == []


def test_another_version_is_refused_naming_it_and_what_to_do():
    with pytest.raises(BatchOffsetError) as refused:
        BatchOffset.from_json('{"v": 2, "parts": {}}')
    assert str(refused.value) == (
        "ackstream offset: version 2, and this ackstream reads version 1: run the "
        "ackstream that wrote the checkpoint, or start the query from a new checkpoint"
    )


@pytest.mark.parametrize(
    ("logged", "said"),
    [
        ({"v": 1, "parts": {"t": {"x": {"end": 1, "wm": 0}}}}, "field 'parts' is malformed"),
        ({"v": 1, "parts": {}, "read": {"t": {"0": [1]}}}, "field 'read' is malformed"),
        ({"v": 1, "parts": {}, "replays": [["t", 0, 1]]}, "field 'replays' is malformed"),
        ({"v": 1, "parts": {}, "reader": "jvm"}, "field 'reader' is malformed"),
        ({"v": 1, "parts": {}, "source": "words", "ids": "words"}, "no field 'channel'"),
        ({"v": 1}, "not an ackstream source's offset"),
        ("{not json", "not JSON"),
    ],
)
def test_a_malformed_offset_is_refused_naming_the_field(logged, said):
    with pytest.raises(BatchOffsetError, match=said):
        BatchOffset.from_json(logged)


def test_only_an_ackstream_offset_is_ours():
    """A query's other sources log offsets of their own (Spark's Kafka source: a topic's
    offsets per partition), which the offset log passes over."""
    assert BatchOffset.is_ours({"v": 1, "parts": {}})
    assert BatchOffset.is_ours({"v": 9, "parts": {}})  # ours, and then refused for its version
    assert not BatchOffset.is_ours({"events": {"0": 12}})
    assert not BatchOffset.is_ours(None)


def test_a_logged_offset_s_terms_are_checked_against_its_topology_s_as_values(tmp_path):
    """The topology reading an offset holds its source to its own name, channel and
    message timeout, compared as the options table reads them (a folder by any path to
    it); another one is an OptionError naming the option and both values."""
    import os

    from ackstream import LocalChannel, OptionError, Topology
    from ackstream.topology.running import check_source_terms

    folder = tmp_path / "channel"
    topology = Topology("words", None, LocalChannel(str(folder)), message_timeout_ms=30_000)

    def logged(channel: str, timeout_ms: int) -> BatchOffset:
        return BatchOffset({}, tracked=Tracked("words", channel, timeout_ms, "words", 1))

    check_source_terms(topology, logged(os.path.relpath(folder), 30_000))
    check_source_terms(topology, BatchOffset({}))  # untracked: no terms
    with pytest.raises(OptionError) as refused:
        check_source_terms(topology, logged(str(folder), 60_000))
    assert refused.value.option == "ackstream.messageTimeout"
    assert "60000" in str(refused.value) and "30000" in str(refused.value)
    with pytest.raises(OptionError, match="ackstream.channel"):
        check_source_terms(topology, logged("kafka", 30_000))
