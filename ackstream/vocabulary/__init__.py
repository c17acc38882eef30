"""The words every part of the loop shares, with no Spark session and no broker.

- :mod:`ackstream.vocabulary.records`: ack records and completions, the two record
  kinds that cross process boundaries, and their schemas;
- :mod:`ackstream.vocabulary.ranges`: a run of acked offsets as one completion;
- :mod:`ackstream.vocabulary.batch_offset`: the source's offset, its one message to
  the batch, and its JSON;
- :mod:`ackstream.vocabulary.partition`: an upstream partition;
- :mod:`ackstream.vocabulary.dead_letter`: a record the source gave up on;
- :mod:`ackstream.vocabulary.ids`: root and edge ids by hash, in numpy and in Spark;
- :mod:`ackstream.vocabulary.lineage`: the columns a tracked row carries;
- :mod:`ackstream.vocabulary.clock`: the one clock ackstream reads (epoch ms);
- :mod:`ackstream.vocabulary.arrays`: the numpy passes the bookkeeping shares.

Nothing here imports another part of ackstream: every other package may import it.
"""
