"""Fixtures of the source's tests."""

import pytest

from ackstream.channels.local import LocalChannel
from ackstream.config.source import parse
from ackstream.sources.spout import open_spout
from ackstream.sources.starting import initial_offset
from ackstream.sources.upstream import open_upstream
from ackstream.testing import FakeClock


@pytest.fixture
def make_spout(tmp_path):
    """``make_spout(**options) -> (spout, channel, clock)``; options as ``ackstream.<name>``."""
    made = []

    def make(**options):
        config = parse(
            {
                "ackstream.upstream": "generator",
                "ackstream.topology": "spout",
                "ackstream.channel": str(tmp_path / "channel"),
                "ackstream.generator.count": "10",
                "ackstream.messageTimeout": "10s",
                **{f"ackstream.{k}": str(v) for k, v in options.items()},
            }
        )
        channel, clock = LocalChannel(config.channel), FakeClock()
        upstream = open_upstream(config)
        spout = open_spout(
            config, upstream, channel, initial_offset(config, upstream, channel), clock
        )
        made.append(spout)
        return spout, channel, clock

    yield make
    for spout in made:
        spout.close()
