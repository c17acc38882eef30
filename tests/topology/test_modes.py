"""Every mode answers the questions stages and the batch ask it, consistently with
what the mode is: untracked carries nothing and records nothing, a tracked mode
carries lineage, records its tuples' fates and keeps trees open while it holds tuples.
No Spark: the answers are the mode's own."""

from __future__ import annotations

import pytest

from ackstream.sources.offsets import PlannedRoots
from ackstream.topology.modes import (
    ACK_MODES,
    PER_STAGE,
    TELESCOPED,
    UNTRACKED,
    Continuing,
    Mode,
)
from ackstream.vocabulary.records import ACK_RECORD_SCHEMA

TRACKED = [TELESCOPED, PER_STAGE, Continuing(TELESCOPED), Continuing(PER_STAGE)]
EVERY = [UNTRACKED, *TRACKED]
PLANNED = PlannedRoots.of_inits(ACK_RECORD_SCHEMA.empty_table())


def ids(mode: Mode) -> str:
    return f"continuing-{mode.name}" if mode.continues_trees else mode.name


def questions(mode: Mode) -> dict[str, bool]:
    return {
        "carries_lineage": mode.carries_lineage,
        "makes_ack_records": mode.makes_ack_records,
        "holding_keeps_trees_open": mode.holding_keeps_trees_open,
        "inits_from_rows(nothing planned)": mode.inits_from_rows(None),
        "inits_from_rows(planned)": mode.inits_from_rows(PLANNED),
    }


def test_the_modes_asked_are_every_mode_a_topology_is_declared_with():
    assert {m.name for m in TRACKED} == set(ACK_MODES)
    assert all(m in TRACKED for m in ACK_MODES.values())


@pytest.mark.parametrize("mode", EVERY, ids=ids)
def test_each_answer_is_a_bool(mode):
    assert all(type(answer) is bool for answer in questions(mode).values()), questions(mode)


def test_untracked_carries_no_lineage_records_nothing_and_holds_no_tree_open():
    assert not any(questions(UNTRACKED).values()), questions(UNTRACKED)
    assert not UNTRACKED.anchoring.edges
    assert not (UNTRACKED.hold_records or UNTRACKED.holds_by_token or UNTRACKED.own_roots)


@pytest.mark.parametrize("mode", TRACKED, ids=ids)
def test_a_tracked_mode_carries_lineage_records_and_holding_keeps_its_trees_open(mode):
    assert mode.carries_lineage and mode.makes_ack_records and mode.holding_keeps_trees_open
    assert mode.inits_from_rows(None)  # nothing planned the roots: only the rows name them


@pytest.mark.parametrize("mode", EVERY, ids=ids)
def test_the_answers_agree_with_each_other(mode):
    if mode.makes_ack_records:  # a record names a root, which the rows carry
        assert mode.carries_lineage
    if mode.holding_keeps_trees_open:  # a tree is open in the records only
        assert mode.makes_ack_records
    if mode.hold_records or mode.holds_by_token:  # ways of keeping a held tuple's tree open
        assert mode.holding_keeps_trees_open
    if mode.anchoring.edges:  # edge ids are lineage
        assert mode.carries_lineage
    if mode.inits_from_rows(None) or mode.inits_from_rows(PLANNED):
        assert mode.makes_ack_records  # inits are ack records
    if mode.makes_ack_records and not mode.inits_from_rows(PLANNED):
        assert mode.plans_inits  # it takes planned inits only if it may


@pytest.mark.parametrize("mode", [m for m in TRACKED if m.continues_trees], ids=ids)
def test_a_continuing_mode_reads_its_inits_from_the_rows_even_when_planned(mode):
    assert mode.inits_from_rows(PLANNED)
    assert not mode.own_roots
