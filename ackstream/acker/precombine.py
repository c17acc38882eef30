"""Pre-combine a batch's ack records per root before they go to the ack channel.

XOR is associative, so all records of one root in a batch fold into one: values
by XOR, fail/reset bits by OR, and the init bit by parity, so that a record
delivered twice still cancels itself after combination. The init's coordinates
and timestamp survive because they are taken from the init row. (An init
delivered twice in one batch cancels: that root times out, and the source, which
knows its roots, replays it.) It is the ledger's own ``combine``, run on the
driver: a batch's records are few (one init per root plus fails with the
default ``ack_mode``), so collecting them costs less than a shuffle in Spark.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ackstream.acker.ledger import combine
from ackstream.records import ACK_RECORD_SCHEMA, INIT

__all__ = ["precombine"]


def precombine(records: pa.Table) -> pa.Table:
    """One ack record per root of ``records`` (``ACK_RECORD_SCHEMA`` columns, any order)."""
    if not records.num_rows:
        return ACK_RECORD_SCHEMA.empty_table()
    c = combine(records.select(ACK_RECORD_SCHEMA.names).to_pandas())
    known = (c.kind & INIT) != 0  # coordinates come from an init row
    kind = (c.kind & ~INIT) | np.where(c.init_odd, INIT, 0)
    return pa.table({
        "root": c.root,
        "value": c.value,
        "kind": kind.astype(np.int8),
        "topic": pa.array(c.topic, pa.string()),
        "partition": pa.array(c.partition, pa.int32(), mask=~known),
        "offset": pa.array(c.offset, pa.int64(), mask=~known),
        "attempt": pa.array(c.attempt, pa.int32(), mask=~known),
        "ts": c.ts,
        "reason": pa.array(c.reason, pa.string()),
    }, schema=ACK_RECORD_SCHEMA)
