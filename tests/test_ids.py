"""Ids from numpy equal Spark's xxhash64, and re-deriving them gives the same ids."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackstream.vocabulary import ids

int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def test_root_ids_are_reproducible_and_change_with_every_coordinate():
    base = ids.root_ids("topo", "t", 0, 10, 0)
    assert ids.root_ids("topo", "t", 0, 10, 0) == base
    others = [
        ids.root_ids("other", "t", 0, 10, 0),
        ids.root_ids("topo", "u", 0, 10, 0),
        ids.root_ids("topo", "t", 1, 10, 0),
        ids.root_ids("topo", "t", 0, 11, 0),
        ids.root_ids("topo", "t", 0, 10, 1),  # a replay gets a new root
    ]
    assert len({int(base), *map(int, others)}) == 6


def test_array_topics_hash_like_scalar_topics():
    topics = np.array(["a", "b", "a"], dtype=object)
    many = ids.root_ids("s", topics, [0, 1, 2], [5, 6, 7], [0, 0, 3])
    one_by_one = [
        ids.root_ids("s", t, p, o, a) for t, p, o, a in zip(topics, [0, 1, 2], [5, 6, 7], [0, 0, 3])
    ]
    assert many.tolist() == [int(x) for x in one_by_one]


def test_children_of_one_parent_are_distinct():
    edges = ids.child_edges(np.full(1000, 12345), 1, np.arange(1000))
    assert len(set(edges.tolist())) == 1000


def test_shard_matches_spark_pmod_for_negative_roots():
    assert ids.shard_of([-7, 7, -1], 4).tolist() == [1, 3, 3]


@pytest.mark.spark
@settings(deadline=None, max_examples=25)
@given(st.lists(st.tuples(int64s, int64s), min_size=1, max_size=20), st.text(max_size=70))
def test_numpy_and_spark_sql_give_equal_ids(spark, pairs, text):
    from pyspark.sql import functions as F

    df = spark.createDataFrame(pairs, "a long, b long")
    got = df.select(
        F.xxhash64("a", "b").alias("h2"),
        ids.spark_child_edge("a", 3, "b").alias("child"),
        F.xxhash64(F.lit(text)).alias("text"),
        F.pmod("a", F.lit(5).cast("long")).alias("shard"),
    ).toPandas()
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    assert got["h2"].tolist() == ids.hash_longs(a, b).tolist()
    assert got["child"].tolist() == ids.child_edges(a, 3, b).tolist()
    assert set(got["text"]) == {ids.hash_text(text)}
    assert got["shard"].tolist() == ids.shard_of(a, 5).tolist()


@pytest.mark.spark
def test_spark_root_id_equals_numpy_root_ids(spark):
    rows = [("orders", 0, 0, 0), ("orders", 3, 2**40, 2), ("ünïcode-topic", 1, 7, 1)]
    df = spark.createDataFrame(rows, "topic string, partition int, offset long, attempt int")
    got = df.select(ids.spark_root_id("topo").alias("r")).toPandas()["r"].tolist()
    t, p, o, a = zip(*rows)
    assert got == ids.root_ids("topo", np.array(t, dtype=object), p, o, a).tolist()
