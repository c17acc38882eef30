"""Topics deleted under a running query, told apart from brokers that do not answer.

kafka-python does not say that a topic is gone: an offset request, a commit or a send
for a deleted topic waits for it to come back until the request or delivery timeout
(30 s, 120 s), just as it waits for brokers that are down, and then only says that it
timed out. A fresh topic listing tells the two apart: the brokers answer it, and the
topic is not in it. The clients that read or write a topic ask once per planning
round or write, before the calls that would wait, and again when a call fails; a
:class:`TopicListing` spares them asking twice within kafka-python's metadata backoff.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterable
from typing import Any, TypeVar

from ackstream.vocabulary.clock import Clock, now_ms

__all__ = [
    "CHECK_EVERY_S",
    "TopicListing",
    "deleted_topics",
    "never_create_topics",
    "shared_listing",
]

#: a kafka-python consumer or producer
_Client = TypeVar("_Client")

#: How often a client waiting on a topic (a producer's flush) asks whether it is there.
CHECK_EVERY_S = 1.0


def deleted_topics(topics: Iterable[str], list_topics: Callable[[], Container[str]]) -> list[str]:
    """The ``topics`` the brokers do not list, sorted. ``list_topics()`` asks them for
    every topic name with a fresh metadata request (``KafkaConsumer.topics``); a Kafka
    error from it means the brokers did not answer, which says nothing of the topics
    (none are called deleted).

    >>> deleted_topics(["a", "b"], lambda: {"a", "c"})
    ['b']
    """
    from kafka.errors import KafkaError

    try:
        listed = list_topics()
    except KafkaError:
        return []
    return sorted(topic for topic in set(topics) if topic not in listed)


class TopicListing:
    """The listing of every topic name of one set of brokers, asked again only once a
    client would send the request at once. kafka-python holds a metadata request made
    within ``retry_backoff_ms`` of its last one until that much time has passed: a
    planner that asked when it planned a batch and again in the ``commit()`` Spark calls
    right after waited up to that long (100 ms by default) every batch, for a listing no
    newer than the one it had. Clients of the same brokers (the same bootstrap servers
    and security protocol) share the answer within that time (see :func:`shared_listing`).
    A client of other brokers, or a call after :meth:`forget` (a request just failed:
    the answer must be new), asks again at once."""

    def __init__(self, clock: Clock = now_ms):
        self._clock = clock
        self._last: tuple[object, int, Collection[str]] | None = None  # asker, when, names

    def names(self, client: Any, having: Iterable[str] = ()) -> Collection[str]:
        """``client.topics()``, or its answer of less than the client's backoff ago if
        that lists every topic ``having`` names (one missing from it may have been made
        since: the brokers are asked)."""
        last = self._last
        config = getattr(client, "config", None)  # kafka-python's settings
        backoff_ms = config.get("retry_backoff_ms", 100) if isinstance(config, dict) else 100
        asker = _brokers(client) or client
        if (
            last is not None
            and last[0] == asker
            and self._clock() - last[1] < backoff_ms
            and all(topic in last[2] for topic in having)
        ):
            return last[2]
        names: Collection[str] = client.topics()
        self._last = (asker, self._clock(), names)
        return names

    def forget(self) -> None:
        self._last = None


_SHARED = TopicListing()


def shared_listing() -> TopicListing:
    """The listing the long-lived clients of this process share: a source's planner asks
    for its upstream topics and its Kafka channel's with two clients of the same brokers
    every trigger, and one answer serves both."""
    return _SHARED


def _brokers(client: Any) -> tuple[str, str] | None:
    """Which brokers a kafka-python ``client`` asks (None when its settings do not say)."""
    config = getattr(client, "config", None)
    if not isinstance(config, dict) or not config.get("bootstrap_servers"):
        return None
    servers = config["bootstrap_servers"]
    servers = [servers] if isinstance(servers, str) else list(servers)
    return ",".join(sorted(servers)), str(config.get("security_protocol", "PLAINTEXT"))


def never_create_topics(client: _Client) -> _Client:
    """``client`` (a kafka-python consumer or producer), made to never ask the brokers to
    create a topic. kafka-python 3.0 takes ``allow_auto_create_topics=False`` but its
    metadata requests do not carry it: a client assigned to (or sending to) a deleted
    topic had a broker that creates topics on demand re-create it, empty and with the
    broker's default partition count, and the deletion went unseen."""
    # private names, a consumer's and a producer's: kafka-python has no public handle;
    # where it keeps them elsewhere (another version) nothing is changed
    metadata = getattr(client, "_cluster", None) or getattr(client, "_metadata", None)
    config = getattr(metadata, "config", None)
    if isinstance(config, dict):
        config["allow_auto_create_topics"] = False
    return client
