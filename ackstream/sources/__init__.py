"""The ``ackstream`` data source: Kafka and generator upstreams, tracked spout tuples."""
