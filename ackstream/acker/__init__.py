"""Storm's acker: the pure XOR ledger and the Spark query that runs it per shard."""
