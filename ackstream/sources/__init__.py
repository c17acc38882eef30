"""The ``ackstream`` data source: Kafka and generator upstreams, tracked spout tuples,
and a session with the source registered (:func:`ackstream.sources.launch.local_session`)."""
