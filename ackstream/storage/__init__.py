"""The files ackstream keeps beside Spark's: folders other processes list, and the
small files of a query's checkpoint.

- :mod:`ackstream.storage.files`: files readers see whole or not at all (a hidden
  name, then a rename), and per-batch state of ``foreachBatch`` queries;
- :mod:`ackstream.storage.checkpoint_files`: small text files of a checkpoint at a
  plain path or a file system URL, through the session's Hadoop file system;
- :mod:`ackstream.storage.offset_log`: the one reader of Spark's offset log, which
  names the records a topology batch holds.
"""
