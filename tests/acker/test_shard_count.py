"""The acker's shard count is fixed for the life of its checkpoint."""

import pytest

from ackstream.acker.query import check_shard_count
from ackstream.errors import OptionError


def test_a_checkpoint_keeps_the_shard_count_it_started_with(tmp_path):
    checkpoint = str(tmp_path / "acker")
    check_shard_count(checkpoint, 2)
    check_shard_count(checkpoint, 2)  # a restart with the same count
    with pytest.raises(OptionError, match="ackers.*3.*expected 2, the count"):
        check_shard_count(checkpoint, 3)
    check_shard_count(str(tmp_path / "other"), 3)  # a new checkpoint may choose


@pytest.mark.parametrize("ackers", [0, -1])
def test_no_shards_is_an_error_naming_the_option(tmp_path, ackers):
    with pytest.raises(OptionError, match="ackers"):
        check_shard_count(str(tmp_path / "acker"), ackers)
