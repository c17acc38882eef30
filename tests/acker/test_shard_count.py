"""The acker's shard count is fixed for the life of its checkpoint."""

import pytest

from ackstream.acker.query import SHARDS_FILE, check_shard_count
from ackstream.errors import OptionError


def test_a_checkpoint_keeps_the_shard_count_it_started_with(tmp_path):
    checkpoint = str(tmp_path / "acker")
    check_shard_count(None, checkpoint, 2)
    check_shard_count(None, checkpoint, 2)  # a restart with the same count
    with pytest.raises(OptionError, match="ackers.*3.*expected 2, the count"):
        check_shard_count(None, checkpoint, 3)
    check_shard_count(None, str(tmp_path / "other"), 3)  # a new checkpoint may choose


@pytest.mark.parametrize("ackers", [0, -1])
def test_no_shards_is_an_error_naming_the_option(tmp_path, ackers):
    with pytest.raises(OptionError, match="ackers"):
        check_shard_count(None, str(tmp_path / "acker"), ackers)


@pytest.mark.spark
def test_a_checkpoint_at_a_url_keeps_its_shard_count_too(spark, tmp_path):
    """``file:``, ``hdfs:``, ``s3a:``...: kept and read through the session's file system."""
    checkpoint = (tmp_path / "acker").as_uri()
    check_shard_count(spark, checkpoint, 2)
    check_shard_count(spark, checkpoint, 2)
    with pytest.raises(OptionError, match=f"ackers.*3.*expected 2, the count .*{checkpoint}"):
        check_shard_count(spark, checkpoint, 3)
    # the same folder as a plain path: the count kept through the URL holds
    with pytest.raises(OptionError, match="expected 2"):
        check_shard_count(spark, str(tmp_path / "acker"), 3)


@pytest.mark.spark
def test_a_count_a_connect_client_wrote_as_a_folder_is_read_by_any_session(spark, tmp_path):
    """A Spark Connect client writes the count at a URL with a Spark job: a folder of
    that name holding the text. A classic session reads it and refuses another count."""
    checkpoint = (tmp_path / "acker").as_uri()
    count = spark.createDataFrame([('{"ackers": 2}',)], "value string").coalesce(1)
    count.write.text(f"{checkpoint}/{SHARDS_FILE}")
    check_shard_count(spark, checkpoint, 2)
    with pytest.raises(OptionError, match="expected 2, the count"):
        check_shard_count(spark, checkpoint, 3)
