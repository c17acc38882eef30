"""What ackstream asks of Spark in the driver, below every part that runs in it.

- :mod:`ackstream.spark.session`: what a session is (Spark Connect or classic, its
  master, the Java it runs on, whether it has Spark's Kafka connector);
- :mod:`ackstream.spark.observed`: counts Spark computes while a job reads a frame
  anyway, read back without waiting;
- :mod:`ackstream.spark.driver`: Ctrl-C as an event a wait polls instead of an
  exception inside a py4j call, and pyspark's loggers that print the errors they
  convert.

Making a session, with ackstream's data sources registered, is
:func:`ackstream.local_session`'s: it sits above the sources it registers.
"""
