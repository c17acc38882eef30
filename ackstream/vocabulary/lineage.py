"""The lineage columns a tracked row carries, named once.

A tracked row is a Storm tuple. The ``ackstream`` source emits each record with
``_root`` (the id of its tuple tree), ``_edge`` (the tuple's own 64-bit id) and
``_attempt``; a row anchored to several parents (an aggregate's output) carries
``_anchors`` instead of a single root when every edge is acked (per-stage acks),
or only ``_group``, the aggregate group it came from, when acks telescope: its
roots are looked up from the aggregate's input only if the row fails. A failed
or rejected row carries ``_reason`` for its dead letter; so does a row the source
held back from the bolts (``ackstream.sources.rows``). Sinks drop these
columns before they show rows to users; stages keep them.
"""

from __future__ import annotations

__all__ = [
    "ANCHORS",
    "ATTEMPT",
    "EDGE",
    "GROUP",
    "LINEAGE_COLUMNS",
    "NO_RECORD",
    "REASON",
    "REASON_LIMIT",
    "ROOT",
    "ROOTS",
    "TRACKED_COLUMNS",
]

ROOT = "_root"  #: the root id of the tuple tree a row belongs to (null: see ANCHORS)
EDGE = "_edge"  #: the row's own edge id, from which its children's ids derive
ATTEMPT = "_attempt"  #: how often the row's upstream record was emitted before
ANCHORS = "_anchors"  #: ``array<struct<root, edge>>`` of a multi-anchored row
#: ``struct<stage int, id long>``: the aggregate stage and group (a hash of its keys)
#: a row came from; its roots are found from that stage's input when it fails
GROUP = "_group"
REASON = "_reason"  #: on failed or rejected rows: why, for the dead letter
#: Characters of an exception's text (or a sink's refusal) kept as a ``_reason``.
REASON_LIMIT = 500
#: ``array<bigint>``: every root a row belongs to, its own and its anchors' (added by
#: ``topology.bolts.with_tree_roots``; a continuing sink hands it back with the rows
#: it wrote)
ROOTS = "_roots"
#: ``_reason`` of a source row held back because its offset holds no record (compacted
#: away, a transaction marker): nothing to process, its tree is done
NO_RECORD = "no record at this offset"

#: Columns a stage keeps and a sink drops.
LINEAGE_COLUMNS = (ROOT, EDGE, ANCHORS, GROUP)
#: Columns a tracked input stream must have (the ``ackstream`` source's own).
TRACKED_COLUMNS = (ROOT, EDGE, ATTEMPT, "topic", "partition", "offset")
