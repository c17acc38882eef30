"""The Upstream contract: one suite that the Kafka and the generator upstream both pass."""

import pyarrow as pa
import pytest

from ackstream.config.source import parse
from ackstream.sources.rows import SOURCE_SCHEMA, ReadTask
from ackstream.sources.upstream import Upstream, open_upstream
from ackstream.vocabulary import ids

RECORDS = 10  # per partition


@pytest.fixture(params=["generator", pytest.param("kafka", marks=pytest.mark.broker)])
def upstream(request, tmp_path):
    """An upstream of two partitions holding RECORDS records each."""
    if request.param == "generator":
        config = parse(
            {
                "ackstream.upstream": "generator",
                "ackstream.topology": "contract",
                "ackstream.channel": str(tmp_path),
                "ackstream.generator.count": str(2 * RECORDS),
            }
        )
    else:
        from kafka import KafkaProducer

        bootstrap = request.getfixturevalue("broker").bootstrap
        topic = request.getfixturevalue("new_topic")(partitions=2)
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        for i in range(2 * RECORDS):
            producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
        producer.flush()
        producer.close()
        config = parse(
            {
                "kafka.bootstrap.servers": bootstrap,
                "subscribe": topic,
                "ackstream.topology": "contract",
                "kafka.group.id": f"contract-{topic}",
            }
        )
    up = open_upstream(config)
    yield up
    up.close()


def rows(up: Upstream, task: ReadTask) -> list[dict]:
    batches = list(up.read(task))
    assert all(b.schema == SOURCE_SCHEMA for b in batches)
    return pa.Table.from_batches(batches, SOURCE_SCHEMA).to_pylist()


def test_it_is_an_upstream_that_answers_its_check(upstream):
    assert isinstance(upstream, Upstream)
    upstream.check()


def test_partitions_have_every_record_between_earliest_and_latest(upstream):
    tps = upstream.partitions()
    assert len(tps) == 2 and tps == upstream.partitions()
    earliest = upstream.earliest(tps)
    latest = upstream.latest(tps, {tp: 0 for tp in tps})
    assert all(latest[tp] - earliest[tp] == RECORDS for tp in tps)


def test_read_gives_the_same_rows_with_ids_by_hash_every_time(upstream):
    topic, partition = upstream.partitions()[1]
    task = ReadTask(topic, partition, 2, 6, replays=((0, 3),))
    first = rows(upstream, task)
    assert first == rows(upstream, task)
    offsets = [r["offset"] for r in first]
    attempts = [r["_attempt"] for r in first]
    assert list(zip(offsets, attempts)) == [(2, 0), (3, 0), (4, 0), (5, 0), (0, 3)]
    namespace = upstream.config.id_namespace  # the topology, with the group if not its own
    assert namespace.startswith("contract")
    assert [r["_root"] for r in first] == ids.root_ids(
        namespace, topic, partition, offsets, attempts
    ).tolist()
    assert {(r["topic"], r["partition"]) for r in first} == {(topic, partition)}


def test_fetch_gives_the_key_and_value_that_read_gives(upstream):
    tp = upstream.partitions()[0]
    read = {r["offset"]: (r["key"], r["value"]) for r in rows(upstream, ReadTask(*tp, 0, 4))}
    fetched = upstream.fetch([(tp, 1), (tp, 3)])
    assert {off: fetched[(tp, off)][:2] for off in (1, 3)} == {1: read[1], 3: read[3]}


def test_a_commit_is_read_back_with_its_metadata(upstream):
    tps = upstream.partitions()
    assert upstream.committed(tps) == {}
    upstream.commit({tps[0]: (4, '{"done":[[6,8]]}')})
    assert upstream.committed(tps) == {tps[0]: (4, '{"done":[[6,8]]}')}
