"""The one place that seeks and polls with the Kafka client (kafka-python).

- :mod:`ackstream.kafka.settings`: ``kafka.*`` options as kafka-python settings.
- :mod:`ackstream.kafka.offsets`: the true end of a partition on every broker.
- :mod:`ackstream.kafka.reading`: records of offset ranges, and the ranges of a
  topic past a position.

The source's upstream, the Kafka channel and ``ackstream status`` read through
these; none of them keeps a poll loop of its own.
"""
