"""Topics deleted under a running query, told apart from brokers that do not answer.

kafka-python does not say that a topic is gone: an offset request, a commit or a send
for a deleted topic waits for it to come back until the request or delivery timeout
(30 s, 120 s), just as it waits for brokers that are down, and then only says that it
timed out. A fresh topic listing tells the two apart: the brokers answer it, and the
topic is not in it. The clients that read or write a topic ask once per planning
round or write, before the calls that would wait, and again when a call fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["deleted_topics"]


def deleted_topics(topics: Iterable[str], list_topics: Callable[[], Iterable[str]]) -> list[str]:
    """The ``topics`` the brokers do not list, sorted. ``list_topics()`` asks them for
    every topic name with a fresh metadata request (``KafkaConsumer.topics``); a Kafka
    error from it means the brokers did not answer, which says nothing of the topics
    (none are called deleted).

    >>> deleted_topics(["a", "b"], lambda: {"a", "c"})
    ['b']
    """
    from kafka.errors import KafkaError

    try:
        listed = set(list_topics())
    except KafkaError:
        return []
    return sorted(set(topics) - listed)
