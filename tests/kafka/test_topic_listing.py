"""TopicListing: a client's topic names, asked again only past kafka-python's backoff."""

from __future__ import annotations

from ackstream.kafka.topics import TopicListing, deleted_topics
from ackstream.testing import FakeClock


class Lister:
    """A kafka-python client's ``config`` and ``topics()``, counting the requests."""

    def __init__(self, listed, backoff_ms=None):
        self.listed, self.asked = set(listed), 0
        self.config = {} if backoff_ms is None else {"retry_backoff_ms": backoff_ms}

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
