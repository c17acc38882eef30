"""The local channel on a master whose executors may run on other hosts."""

import pytest

from ackstream import OptionError, Topology
from ackstream.channels import KafkaChannel, LocalChannel, check_reach
from ackstream.config.source import parse

CLUSTER = "spark://127.0.0.1:7077"


class FakeSession:
    """Just what the topology asks a session before it loads or starts anything."""

    def __init__(self, master: str):
        self.conf = self
        self.master = master

    def get(self, key, default=None):
        return self.master if key == "spark.master" else default

    @property
    def readStream(self):  # noqa: N802 - Spark's name
        raise AssertionError("the stream must not be loaded")


@pytest.mark.parametrize("master", [CLUSTER, "yarn", "local-cluster[2,1,1024]", "k8s://h:1"])
def test_a_local_channel_on_a_cluster_master_is_refused_naming_the_option(tmp_path, master):
    with pytest.raises(OptionError) as refused:
        check_reach(LocalChannel(tmp_path), master)
    assert refused.value.option == "ackstream.channel"
    assert refused.value.value == str(tmp_path)
    assert master in str(refused.value) and "shared=True" in str(refused.value)


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[2,3]"])
def test_a_local_channel_on_a_local_master_is_fine(tmp_path, master):
    check_reach(LocalChannel(tmp_path), master)


def test_a_declared_shared_folder_and_the_kafka_channel_are_fine_anywhere(tmp_path):
    check_reach(LocalChannel(tmp_path, shared=True), CLUSTER)
    check_reach(KafkaChannel("127.0.0.1:9", "t"), CLUSTER)


def test_the_topology_refuses_it_before_the_stream_loads_and_before_it_starts(tmp_path):
    topology = Topology("t", FakeSession(CLUSTER), LocalChannel(tmp_path / "ch"))
    options = {"ackstream.upstream": "generator"}
    with pytest.raises(OptionError, match="ackstream.channel"):
        topology.read_stream(options)
    with pytest.raises(OptionError, match="ackstream.channel"):
        topology.start(object(), str(tmp_path / "ckpt"))  # refused before the input is read


def test_the_topology_tells_its_source_that_the_folder_is_shared(tmp_path):
    shared = Topology("t", FakeSession(CLUSTER), LocalChannel(tmp_path, shared=True))
    options = shared.source_options({"ackstream.upstream": "generator"})
    assert options["ackstream.channelShared"] == "true"
    assert parse(options).channel_shared
    alone = Topology("t", FakeSession(CLUSTER), LocalChannel(tmp_path))
    with pytest.raises(OptionError, match="channelShared"):  # the channel says otherwise
        alone.source_options({"ackstream.channelShared": "true"})


def test_channel_shared_is_refused_with_the_kafka_channel():
    with pytest.raises(OptionError, match="channelShared"):
        parse(
            {
                "kafka.bootstrap.servers": "127.0.0.1:9",
                "subscribe": "a",
                "ackstream.channel": "kafka",
                "ackstream.channelShared": "true",
            }
        )
