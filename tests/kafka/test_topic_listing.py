"""TopicListing: a client's topic names, asked again only past kafka-python's backoff."""

from __future__ import annotations

from ackstream.kafka.topics import TopicListing, deleted_topics
from ackstream.testing import FakeClock


class Lister:
    """A kafka-python client's ``config`` and ``topics()``, counting the requests."""

    def __init__(self, listed, backoff_ms=None, **config):
        self.listed, self.asked = set(listed), 0
        self.config = config if backoff_ms is None else {"retry_backoff_ms": backoff_ms, **config}

    def topics(self):
        self.asked += 1
        return set(self.listed)


def test_a_second_ask_within_the_backoff_reuses_the_answer_and_one_past_it_asks():
    clock, client = FakeClock(), Lister({"a"})
    listing = TopicListing(clock)
    assert listing.names(client) == {"a"}
    client.listed = set()  # deleted, unseen until the backoff has passed
    clock.advance(99)
    assert listing.names(client) == {"a"} and client.asked == 1
    clock.advance(2)
    assert listing.names(client) == set() and client.asked == 2


def test_the_clients_own_backoff_bounds_the_reuse():
    clock, client = FakeClock(), Lister({"a"}, backoff_ms=1000)
    listing = TopicListing(clock)
    listing.names(client)
    clock.advance(500)
    listing.names(client)
    assert client.asked == 1
    clock.advance(600)
    listing.names(client)
    assert client.asked == 2


def test_a_new_client_or_a_forgotten_answer_asks_at_once():
    clock = FakeClock()
    listing = TopicListing(clock)
    first, second = Lister({"a"}), Lister(set())
    listing.names(first)
    assert deleted_topics(["a"], lambda: listing.names(second)) == ["a"]
    listing.names(first)
    listing.forget()
    first.listed = set()
    assert deleted_topics(["a"], lambda: listing.names(first)) == ["a"]
    assert (first.asked, second.asked) == (3, 1)


def test_clients_of_the_same_brokers_share_an_answer_within_the_backoff():
    """A planner lists the topics with its upstream consumer and its channel's each
    trigger: the second asks nothing. A client of other brokers, or with another
    security protocol, asks for itself."""
    clock = FakeClock()
    listing = TopicListing(clock)
    upstream = Lister({"a"}, bootstrap_servers="127.0.0.1:9092")
    channel = Lister({"a"}, bootstrap_servers=["127.0.0.1:9092"])
    listing.names(upstream)
    assert listing.names(channel) == {"a"} and channel.asked == 0
    other = Lister({"b"}, bootstrap_servers="127.0.0.1:9093")
    secured = Lister({"c"}, bootstrap_servers="127.0.0.1:9092", security_protocol="SSL")
    assert listing.names(other) == {"b"} and listing.names(secured) == {"c"}
    clock.advance(101)
    listing.names(secured)
    assert (upstream.asked, channel.asked, other.asked, secured.asked) == (1, 0, 1, 2)


def test_a_topic_missing_from_a_reused_answer_is_asked_for_again():
    """Made after the last answer, a topic is not called deleted on that answer's word."""
    clock = FakeClock()
    listing = TopicListing(clock)
    upstream = Lister({"a"}, bootstrap_servers="127.0.0.1:9092")
    channel = Lister({"a", "made-since"}, bootstrap_servers="127.0.0.1:9092")
    listing.names(upstream)
    assert deleted_topics(["made-since"], lambda: listing.names(channel, ["made-since"])) == []
    assert channel.asked == 1
    assert listing.names(upstream, ["a"]) == {"a", "made-since"} and upstream.asked == 1
