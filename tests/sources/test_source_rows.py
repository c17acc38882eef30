"""What read() yields, and how a batch is planned: deterministic, no Spark, no broker."""

import numpy as np

from ackstream.config.source import parse
from ackstream.sources.generator import GeneratorUpstream, sentence
from ackstream.sources.rows import SOURCE_SCHEMA, ReadTask
from ackstream.sources.spout import share_by_lag
from ackstream.vocabulary import ids

GEN = {"ackstream.upstream": "generator", "ackstream.topology": "t"}


def test_generator_read_is_deterministic_and_ids_are_by_hash(tmp_path):
    cfg = parse({**GEN, "ackstream.channel": str(tmp_path)})
    task = ReadTask("generator", 1, 5, 9, replays=((2, 3),))
    first, again = list(GeneratorUpstream(cfg).read(task)), list(GeneratorUpstream(cfg).read(task))
    assert first == again and first[0].schema == SOURCE_SCHEMA
    rows = first[0].to_pylist()
    assert [(r["offset"], r["_attempt"]) for r in rows] == [(5, 0), (6, 0), (7, 0), (8, 0), (2, 3)]
    roots = ids.root_ids("t", "generator", 1, [5, 6, 7, 8, 2], [0, 0, 0, 0, 3])
    assert [r["_root"] for r in rows] == roots.tolist()
    assert [r["_edge"] for r in rows] == ids.spout_edges(roots).tolist()
    assert rows[-1]["value"].decode() == sentence(1, 2)
    assert 3 <= len(sentence(1, 2).split()) <= 8


def test_generator_count_and_rate(tmp_path):
    cfg = parse(
        {
            **GEN,
            "ackstream.channel": str(tmp_path),
            "ackstream.generator.count": "5",
            "ackstream.generator.partitions": "2",
        }
    )
    up = GeneratorUpstream(cfg)
    assert up.latest(up.partitions()) == {("generator", 0): 3, ("generator", 1): 2}
    slow = GeneratorUpstream(parse({**GEN, "ackstream.generator.rate": "0.001"}))
    assert set(slow.latest(slow.partitions(), {("generator", 0): 7}).values()) == {7, 0}
    up.commit({("generator", 0): (2, "")})
    assert up.committed(up.partitions()) == {("generator", 0): (2, "")}


def test_max_offsets_per_trigger_is_shared_by_lag():
    lags = {("a", 0): 90, ("a", 1): 10, ("a", 2): 0}
    assert share_by_lag(None, lags) == lags
    assert share_by_lag(10, lags) == {("a", 0): 9, ("a", 1): 1, ("a", 2): 0}
    shares = share_by_lag(7, {("a", 0): 5, ("a", 1): 5})
    assert sum(shares.values()) == 7 and max(shares.values()) == 4
    assert np.all(np.array(list(share_by_lag(3, lags).values())) <= np.array(list(lags.values())))
