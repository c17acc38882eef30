"""The failure path's cost: e2e.py's word count over Apache Kafka with a share of each
batch's records failing on their first attempt, against the same pipeline failing none.

The pipeline is e2e.py's tracked one (Spark's Kafka connector in the session, the Kafka
channel, a ``KafkaSink``), with ``maxOffsetsPerTrigger`` records a batch
(``--batch-sizes``), and a first stage that fails ``--fractions`` of the records read
anew, in one of three variants:

- ``fail_where``: ``.fail_where(condition)`` before the word count's stages;
- ``pandas_bolt``: a pandas bolt in place of the first map (it decodes the line) that
  raises when its chunk holds a failing record, as a user's bolt calling a service that
  refuses part of a batch would. Raising is how a pandas bolt fails a record: the chunk
  is bisected until the raising rows are alone, and only their roots fail; a row the
  bolt does not return is acked without children, as Storm's ack without an emit;
- ``collector_fail``: the same pandas bolt failing those records with
  ``collector.fail(rows, reason)`` instead of raising (Storm's ``collector.fail``): the
  bolt is called once a chunk, and the rest of the chunk goes on.

A failing record is one whose ``offset * 7919 mod 10,000`` is below the fraction's share
of 10,000 (exactly that share of every 10,000 offsets of a partition, spread over them)
and whose ``_attempt`` is 0: it fails once and goes through on its replay, after the
source's default backoff. Replays take room of ``maxOffsetsPerTrigger`` (the spout
reads fewer new records beside them), so batches do not all carry the same records.

The figures, of the steady state: a run reads ``--warmup-batches`` batches of new records
(not timed), ``--batches`` timed ones and one more whose start ends the window; each
batch's start, new records and replays come from the query's progress (the spout's
offset). Over the window, from the start of the first timed batch to the start of that
last one: ``s_per_batch``, the wall time per ``maxOffsetsPerTrigger`` new records read
(the replays run in between included), and ``settled_per_s``, records acked or
dead-lettered a second (the spout's counts at those two starts). The run then goes on
until every offset is committed and checks the work: the output's word counts equal the
input's (nothing lost, nothing counted twice), every record acked, none dead-lettered
or timed out, and each failing record failed exactly once. A run still going after
``--timeout-s`` is cut: its figures are those of the batches it ran (:func:`partial`),
and its case is not repeated.

Warm, not cold: the session is long-lived; before the timed runs of a batch size a
warm-up round runs each variant once at 0 % (dropped, its figures kept apart in the
JSON). Repeats (``--repeats``) alternate the order of the cases (A B C, then C B A);
``/proc/loadavg`` is recorded before and after each run. A case's ratio is its time per
batch over the clean (0 %) case of its variant in the same repeat; the mean of those
pairs is judged against ``TARGETS``.

    .venv/bin/python benchmarks/failure_path.py [--batch-sizes 100000,20000] [--batches 6]

Prints tables and writes JSON to ``benchmarks/results/failure-path-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import sys
import tempfile
import time
import types
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from e2e import (  # noqa: E402
    check_same_work,
    create_topic,
    loadavg,
    machine,
    make_input,
    own_broker,
    read_output,
    run_config,
    save,
    spread,
    stop_and_tidy,
)
from e2e_systems import MESSAGE_TIMEOUT_MS, SPARK_CONF, spark_kafka_jars  # noqa: E402

VARIANTS = ("fail_where", "pandas_bolt", "collector_fail")
#: failing records are those whose ``offset * SPREAD % SHARES`` is below their share
#: of SHARES: SPREAD is prime, so coprime with SHARES, and each run of SHARES offsets
#: holds exactly that share, scattered rather than in one block
SPREAD, SHARES = 7919, 10_000
#: (variant, failing fraction, comparison, the bound on its time per batch over the
#: clean case's): a bolt that raises is isolated by calling it again on parts of its
#: chunk, so it is allowed more than one that fails its rows through the collector
TARGETS = (
    ("fail_where", 0.01, "<=", 1.3),
    ("fail_where", 1.0, "<=", 2.5),
    ("pandas_bolt", 0.01, "<=", 2.0),
    ("collector_fail", 0.01, "<=", 1.2),
)
TRIGGER_MS = 200  # as e2e.py's Spark systems


def log(message: str) -> None:
    print(f"failure-path: {message}", file=sys.stderr, flush=True)


# --- the pipeline -----------------------------------------------------------------------


def cut_of(fraction: float) -> int:
    """The offsets of every SHARES whose records fail: ``fraction`` of them."""
    return round(fraction * SHARES)


def failing_condition(fraction: float) -> str:
    """The SQL condition of the records to fail on their first attempt."""
    return f"_attempt = 0 AND pmod(offset * {SPREAD}, {SHARES}) < {cut_of(fraction)}"


def failing_offsets(ends: dict[int, int], fraction: float) -> int:
    """How many of the offsets below ``ends`` (per partition, from 0) fail once."""
    cut = cut_of(fraction)
    return sum(
        int(np.count_nonzero(np.arange(end) * SPREAD % SHARES < cut)) for end in ends.values()
    )


def raising_bolt(fraction: float):
    """The pandas bolt: the chunk's lines, or a ``ConnectionError`` when a record of the
    chunk fails (a closure, so that Spark's workers get it by value)."""
    import pandas as pd

    cut = cut_of(fraction)

    def decode(frame):
        failing = (frame["_attempt"] == 0) & ((frame["offset"] * SPREAD) % SHARES < cut)
        if failing.any():
            raise ConnectionError(f"downstream refused {int(failing.sum())} records")
        return pd.DataFrame({"line": frame["value"].str.decode("utf-8")})

    return decode


def failing_bolt(fraction: float):
    """The pandas bolt of ``collector_fail``: the chunk's lines, the failing records
    failed through the collector (a closure, as :func:`raising_bolt`)."""
    import pandas as pd

    cut = cut_of(fraction)

    def decode(frame, collector):
        failing = (frame["_attempt"] == 0) & ((frame["offset"] * SPREAD) % SHARES < cut)
        collector.fail(failing.to_numpy(), "downstream refused it")
        return pd.DataFrame({"line": frame["value"].str.decode("utf-8")})

    return decode


def topology(spark, ctx, name: str, variant: str, fraction: float, output: str):
    """e2e.py's tracked pipeline with the failing stage of ``variant`` first."""
    from pyspark.sql import functions as F

    from ackstream import KafkaChannel, KafkaSink, Topology

    top = Topology(
        name, spark, KafkaChannel(ctx.bootstrap, name), message_timeout_ms=MESSAGE_TIMEOUT_MS
    )
    if variant == "fail_where":
        top = top.fail_where(failing_condition(fraction), "refused on its first attempt")
        top = top.map(lambda df: df.withColumn("line", F.col("value").cast("string")))
    elif variant == "collector_fail":
        top = top.pandas_bolt(failing_bolt(fraction), "line string", collector=True)
    else:
        top = top.pandas_bolt(raising_bolt(fraction), "line string")
    return (
        top.explode(F.split("line", " "), "word")
        .aggregate("word", F.count("*").alias("n"))
        .map(lambda df: df.selectExpr("*", "word AS key", "CAST(n AS STRING) AS value"))
        .sink(KafkaSink(ctx.bootstrap, output))
    )


# --- one run ------------------------------------------------------------------------------


def batches_of(progress: list[dict]) -> list[dict]:
    """Each batch that ran, from the query's progress: its start (s), the new records
    and the replays its offset names, its duration and the spout's counts at its start."""
    from ackstream.ui.status import source_metrics
    from ackstream.vocabulary.batch_offset import BatchOffset

    out = []
    for p in progress:
        if not p["durationMs"].get("addBatch"):
            continue
        (source,) = p["sources"]
        end = BatchOffset.from_json(source["endOffset"])
        counts = source_metrics(p) or {}
        out.append(
            {
                "batch": p["batchId"],
                "start_s": dt.datetime.fromisoformat(p["timestamp"]).timestamp(),
                "new": end.new_records,
                "replays": end.replayed_records,
                "ms": p["durationMs"].get("triggerExecution"),
                "add_batch_ms": p["durationMs"]["addBatch"],
                "settled": counts.get("acked", 0) + counts.get("dead_lettered", 0),
            }
        )
    return out


def window(batches: list[dict], size: int, warm: int, timed: int) -> dict | None:
    """The steady state's figures (see the module doc): from the start of the first batch
    whose new records come after ``warm`` batches' worth to the start of the first after
    ``warm + timed`` batches' worth; None if the batches did not get that far.

    >>> bs = [{"start_s": t, "new": n, "replays": r, "settled": s, "ms": 1}
    ...       for t, n, r, s in [(0, 10, 0, 0), (1, 10, 0, 10), (3, 5, 5, 15), (4, 10, 0, 30),
    ...                          (6, 10, 0, 40)]]
    >>> w = window(bs, 10, 1, 2)  # batches 1 to 3: 25 new records in 5 s
    >>> w["s_per_batch"], w["new"], w["replays"], w["settled_per_s"]
    (2.0, 25, 5, 6.0)
    """
    read, first, last = 0, None, None
    for i, b in enumerate(batches):
        if first is None and read >= warm * size:
            first = i
        if read >= (warm + timed) * size:
            last = i
            break
        read += b["new"]
    if first is None or last is None or last == first:
        return None
    a, z = batches[first], batches[last]
    inside = batches[first:last]
    new = sum(b["new"] for b in inside)
    seconds = z["start_s"] - a["start_s"]
    return {
        "seconds": seconds,
        "new": new,
        "replays": sum(b["replays"] for b in inside),
        "batches": len(inside),
        "s_per_batch": seconds * size / new,
        "settled_per_s": (z["settled"] - a["settled"]) / seconds,
        "longest_batch_s": max(b["ms"] for b in inside) / 1000,
    }


def committed(admin, group: str, topic: str) -> dict[int, int]:
    from kafka.errors import KafkaError

    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
    except KafkaError:  # the group's coordinator is not ready yet
        return {}
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


class NotStarted(RuntimeError):
    """The query failed before its first batch ran: the environment, not the failure
    path (Spark gives a Python worker 10 s, hard-coded, to connect back, which a loaded
    machine passes)."""


def run_case(spark, ctx, inp, variant: str, fraction: float, tag: str) -> dict:
    """One run of ``variant`` failing ``fraction`` over ``inp`` until every input offset
    is committed, then stopped and its work checked; its figures (see the module doc).
    A run still going after ``ctx.timeout_s`` is stopped and reported with ``error`` and
    the figures of the batches it ran (:func:`partial`); so is a query that failed, or a
    failed check. Every outcome keeps the batches' log."""
    from kafka import KafkaAdminClient

    name = f"fp-{ctx.run}-{tag}-{variant.replace('_', '-')}-{cut_of(fraction)}"
    output = create_topic(ctx.bootstrap, ctx.partitions, f"{name}-out")
    top = topology(spark, ctx, name, variant, fraction, output)
    options = {
        "kafka.bootstrap.servers": ctx.bootstrap,
        "subscribe": inp.topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": inp.max_per_batch,
        "kafka.group.id": name,
    }
    load_before = loadavg()
    admin = KafkaAdminClient(bootstrap_servers=ctx.bootstrap, client_id="failure-path")
    running = top.start(
        top.read_stream(options), os.path.join(ctx.workdir, name), trigger_ms=TRIGGER_MS
    )
    try:
        error, counts = wait_settled(running, admin, name, inp, ctx.timeout_s)
        progress, ended_s = running.query.recentProgress, time.time()
    finally:
        running.stop()
        admin.close()
    if progress and progress[0]["batchId"] != 0:
        raise RuntimeError("the query's early progress was dropped: raise numRecentProgressUpdates")
    batches = batches_of(progress)
    if error is not None and not batches:
        raise NotStarted(error)
    result = {
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "counts": {k: v for k, v in counts.items() if k != "partitions"},
    }
    if error is None:
        figures = window(batches, inp.max_per_batch, ctx.warmup_batches, ctx.batches)
        try:
            if figures is None:
                raise RuntimeError("the run's batches did not span the timed window")
            check_counts(name, counts, inp, fraction)
            found, result["output_messages"] = read_output(ctx.bootstrap, output)
            check_same_work(name, inp.counts, found)
        except RuntimeError as failed:
            error = str(failed)
    if error is not None:
        settled = counts.get("acked", 0) + counts.get("dead_lettered", 0)
        figures = partial(batches, inp.max_per_batch, ended_s, settled)
        result["error"] = error
    result.update(**(figures or {}), complete=error is None, batch_log=batches)
    what = f"{variant} {100 * fraction:g} %"
    if figures:
        log(
            f"{what}: {figures['s_per_batch']:.2f} s a batch, {figures['settled_per_s'] or 0:,.0f}"
            f" settled/s, longest batch {figures['longest_batch_s']:.1f} s, load "
            f"{load_before[0]:.1f}/{result['loadavg_after'][0]:.1f}"
            + ("" if error is None else " (the batches it ran)")
        )
    if error is not None:
        log(f"{what}: {error.splitlines()[0]}")
    return result


def wait_settled(running, admin, name: str, inp, timeout_s: float) -> tuple[str | None, dict]:
    """Wait until the group has committed every offset of ``inp`` and the spout's counts
    say every record settled; returns why it stopped short (None: it did not) and the
    spout's counts."""
    from ackstream.ui.status import source_metrics

    deadline = time.monotonic() + timeout_s
    while True:
        counts = source_metrics(running.query.lastProgress) or {}
        if running.exception() is not None:
            return f"query failed: {running.exception()}", counts
        done = committed(admin, name, inp.topic)
        settled = counts.get("acked", 0) + counts.get("dead_lettered", 0)
        if all(done.get(p, 0) >= e for p, e in inp.ends.items()) and settled >= inp.records:
            return None, counts
        if time.monotonic() > deadline:
            return (
                f"cut at --timeout-s {timeout_s:g}: {sum(done.values()):,} of "
                f"{inp.records:,} offsets committed"
            ), counts
        time.sleep(0.2)


def partial(batches: list[dict], size: int, cut_s: float, settled: int) -> dict | None:
    """The figures of a run stopped short at ``cut_s`` (with ``settled`` records settled
    by then), from the start of its second batch (the first starts the query up): the
    time up to the cut per new record of the batches it completed, so the batch it was
    cut in counts its time and not its records. Warm-up batches included: rougher than
    :func:`window`'s. None with fewer than two batches or no new record in them.

    >>> bs = [{"start_s": t, "new": 10, "replays": 0, "settled": s, "ms": 2000}
    ...       for t, s in [(0, 0), (5, 10), (7, 20)]]
    >>> f = partial(bs, 10, cut_s=13, settled=30)  # cut 4 s into a batch after these
    >>> f["s_per_batch"], f["new"], f["settled_per_s"]
    (4.0, 20, 2.5)
    """
    done = batches[1:]
    new = sum(b["new"] for b in done)
    if not new:
        return None
    seconds = cut_s - done[0]["start_s"]
    return {
        "seconds": seconds,
        "new": new,
        "replays": sum(b["replays"] for b in done),
        "batches": len(done),
        "s_per_batch": seconds * size / new,
        "settled_per_s": (settled - done[0]["settled"]) / seconds,
        "longest_batch_s": max(b["ms"] for b in done) / 1000,
    }


def check_counts(name: str, counts: dict, inp, fraction: float) -> None:
    """Fails unless every record was acked, none dead-lettered, timed out or rejected, and
    exactly the failing records failed, once each."""
    failing = failing_offsets(inp.ends, fraction)
    wanted = {
        "acked": inp.records,
        "failed": failing,
        "replayed": failing,
        "dead_lettered": 0,
        "timed_out": 0,
        "rejected": 0,
    }
    wrong = {k: (counts.get(k), v) for k, v in wanted.items() if counts.get(k) != v}
    if wrong:
        raise RuntimeError(f"{name}: the spout's counts (found, expected): {wrong}")


# --- figures ---------------------------------------------------------------------------


def summarize(runs: list[dict]) -> dict:
    """The spread of each figure over the runs that have it: a run stopped short counts
    with the figures of the batches it ran (``complete`` false), one that never started
    a batch does not."""
    return {
        key: spread([r.get(key) for r in runs])
        for key in ("s_per_batch", "settled_per_s", "longest_batch_s")
    } | {
        "complete": all(r.get("complete") for r in runs),
        "errors": [r["error"] for r in runs if "error" in r],
        "runs": runs,
    }


def ratios(cases: dict[str, dict[float, list[dict]]], size: int) -> list[dict]:
    """Each failing case's time per batch over its variant's clean case, paired by repeat:
    the pairs' mean, min and max and the ratio of the medians; the mean is judged."""
    out = []
    bounds = {(variant, f): (comparison, bound) for variant, f, comparison, bound in TARGETS}
    for variant, by_fraction in cases.items():
        clean = by_fraction.get(0.0)
        if not clean:
            continue
        for fraction, runs in by_fraction.items():
            if fraction == 0.0:
                continue
            pairs = [
                r["s_per_batch"] / c["s_per_batch"]
                for r, c in zip(runs, clean)
                if r.get("s_per_batch") and c.get("s_per_batch")
            ]
            medians = [spread([r.get("s_per_batch") for r in rs]) for rs in (runs, clean)]
            comparison, bound = bounds.get((variant, fraction), (None, None))
            figure = spread(pairs)
            mean = figure["mean"] if figure else None
            out.append(
                {
                    "variant": variant,
                    "fraction": fraction,
                    "batch_size": size,
                    "pairs": pairs,
                    "mean": mean,
                    "min": figure["min"] if figure else None,
                    "max": figure["max"] if figure else None,
                    "of_medians": medians[0]["median"] / medians[1]["median"]
                    if all(medians)
                    else None,
                    "target": f"{comparison} {bound}" if comparison else None,
                    "met": None if comparison is None or mean is None else mean <= bound,
                }
            )
    return out


def print_tables(out: dict) -> None:
    def num(value, digits=2):
        return "-" if value is None else f"{value:,.{digits}f}"

    ratio = {(r["variant"], r["fraction"], r["batch_size"]): r for r in out["ratios"]}
    m = out["machine"]
    print(
        f"\n{m['cpu']}, {m['cores_usable']} cores usable, pyspark {m['pyspark']}, "
        f"connector {m['spark_kafka_connector']}, Kafka {m['kafka'] or 'external'}, "
        f"load average at the start {m['loadavg']}"
    )
    for size, figures in out["sizes"].items():
        print(
            f"\n{int(size):,} records a batch, {out['config']['batches']} timed batches a run, "
            f"{out['config']['repeats']} runs alternating"
        )
        print(
            f"  {'variant':<12} {'failing':>7} {'s/batch median':>14} {'min':>6} {'max':>6} "
            f"{'settled/s':>10} {'min':>9} {'max':>9} {'x clean':>7} {'(min-max)':>11} "
            f"{'target':>7} met  load before/after"
        )
        for variant, by_fraction in figures["cases"].items():
            for fraction, s in by_fraction.items():
                t, rate = s["s_per_batch"] or {}, s["settled_per_s"] or {}
                r = ratio.get((variant, float(fraction), int(size)), {})
                span = f"{num(r.get('min'))}-{num(r.get('max'))}" if r else ""
                met = {True: "yes", False: "NO", None: "-"}[r.get("met")]
                loads = " ".join(
                    f"{x['loadavg_before'][0]:.1f}/{x['loadavg_after'][0]:.1f}"
                    for x in s["runs"]
                    if "loadavg_after" in x
                )
                mark = "" if s["complete"] else "*"
                print(
                    f"  {variant + mark:<12} {100 * float(fraction):>6g}% "
                    f"{num(t.get('median')):>14} {num(t.get('min')):>6} {num(t.get('max')):>6} "
                    f"{num(rate.get('median'), 0):>10} {num(rate.get('min'), 0):>9} "
                    f"{num(rate.get('max'), 0):>9} {num(r.get('mean')):>7} {span:>11} "
                    f"{r.get('target') or '-':>7} {met:>3}  {loads}"
                )
                for error in s["errors"]:
                    print(f"    * {error.splitlines()[0][:160]}")
    print("\n  x clean: the mean of the pairs (a case over its clean case, same repeat)")
    print("  *: a run stopped short; its figures are those of the batches it ran")
    print(f"\n{out['wall_s'] / 60:.1f} minutes; load average at the end {out['loadavg_end']}")


# --- the run ------------------------------------------------------------------------------


#: runs of a case whose query never started a batch (see :class:`NotStarted`), at most
STARTS = 4


def recorded(spark, ctx, inp, variant: str, fraction: float, tag: str) -> dict:
    """:func:`run_case`, again (up to :data:`STARTS` times) while its query never starts
    a batch; an error that ends it is recorded as its result (a case that fails is a
    finding, not the end of the benchmark)."""
    for attempt in range(STARTS):
        try:
            return run_case(spark, ctx, inp, variant, fraction, f"{tag}-{attempt}")
        except NotStarted as error:
            log(f"{variant} {100 * fraction:g} %: no batch ran ({str(error)[:200]}), again")
            why = f"NotStarted: {error}"
        except Exception as error:
            log(f"{variant} {100 * fraction:g} % failed: {error}")
            return {"error": f"{type(error).__name__}: {error}"}
    return {"error": why}


def fractions_of(text: str, parser) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if any(not 0 <= v <= 1 for v in values):
        parser.error(f"--fractions {text!r}: each between 0 and 1")
    return [0.0, *(v for v in values if v != 0)]  # the clean case is every ratio's base


def session():
    """The benchmark's session: e2e.py's, with a progress report at once when a trigger
    runs no batch (the run's end is seen from the spout's counts in it)."""
    from ackstream import local_session

    jars = ",".join(spark_kafka_jars())
    conf = {**SPARK_CONF, "spark.sql.streaming.noDataProgressEventInterval": "200ms"}
    return local_session("failure-path", conf={**conf, **({"spark.jars": jars} if jars else {})})


def main(argv=None, spark=None) -> dict:
    """Run the benchmark; ``spark``: a session to use instead of making one (tests)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="100000,20000", help="maxOffsetsPerTrigger")
    parser.add_argument("--batches", type=int, default=6, help="timed batches a run")
    parser.add_argument("--warmup-batches", type=int, default=3, help="read before timing")
    parser.add_argument("--repeats", type=int, default=2, help="runs a case, order alternating")
    parser.add_argument(
        "--fractions", default="0,0.01,0.1,1", help="failing shares of a batch (0 is always run)"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {VARIANTS}")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--no-warmup-round", action="store_true", help="no dropped first runs")
    parser.add_argument("--bootstrap", help="an external Kafka (default: start Apache Kafka)")
    parser.add_argument(
        "--timeout-s", type=float, default=90, help="a run still going then is cut (per run)"
    )
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--output", help="write the JSON here instead of benchmarks/results/")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    fractions = fractions_of(args.fractions, parser)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not set(variants) <= set(VARIANTS) or not variants:
        parser.error(f"--variants {args.variants!r}: choose from {VARIANTS}")
    if not spark_kafka_jars():
        log("Spark's Kafka connector is not resolved (make spark-kafka): new records are read")
        log("by the source's Python read tasks instead, which this benchmark does not claim")

    from broker import kafka_version

    workdir = tempfile.mkdtemp(prefix="ackstream-failure-path-")
    broker, own_session, failed = None, spark is None, True
    try:
        broker, bootstrap = own_broker(args, log)
        started, described = time.time(), machine(kafka_version() if broker else None)
        spark = spark or session()
        ctx = types.SimpleNamespace(
            bootstrap=bootstrap,
            run=uuid.uuid4().hex[:6],
            partitions=args.partitions,
            warmup_batches=args.warmup_batches,
            batches=args.batches,
            workdir=workdir,
            timeout_s=args.timeout_s,
        )
        cases = [(v, f) for v in variants for f in fractions]
        runs = {size: {v: {f: [] for f in fractions} for v in variants} for size in sizes}
        warmup = {}
        for size in sizes:
            # one batch past the timed ones: its start ends the window
            inp = make_input(ctx, f"in-{size}", size, args.warmup_batches, args.batches + 1)
            if not args.no_warmup_round:
                for variant in variants:
                    log(f"{size:,} a batch, warm-up round (dropped): {variant}")
                    result = recorded(spark, ctx, inp, variant, 0.0, f"b{size}-warmup")
                    warmup.setdefault(size, {})[variant] = result.get("s_per_batch")
            for repeat in range(args.repeats):
                for variant, fraction in cases if repeat % 2 == 0 else cases[::-1]:
                    done = runs[size][variant][fraction]
                    if any("error" in r for r in done):
                        continue  # it failed once: it would again, at its timeout's cost
                    log(
                        f"{size:,} a batch, run {repeat + 1}/{args.repeats}: "
                        f"{variant} {100 * fraction:g} %"
                    )
                    result = recorded(spark, ctx, inp, variant, fraction, f"b{size}-r{repeat}")
                    done.append({**result, "repeat": repeat})
        out = {
            "benchmark": "failure_path",
            "date": dt.datetime.now(dt.UTC).isoformat(),
            "machine": described,  # its load average: before the run
            "config": {
                **run_config(args, sizes),
                "trigger_ms": TRIGGER_MS,
                "fractions": fractions,
                "variants": variants,
                "failing": failing_condition(0.5).replace(str(cut_of(0.5)), "<share of 10,000>"),
                "message_timeout_ms": MESSAGE_TIMEOUT_MS,
                "arrow_max_records_per_batch": spark.conf.get(
                    "spark.sql.execution.arrow.maxRecordsPerBatch"
                ),
                "broker": "external" if args.bootstrap else "Apache Kafka, one KRaft node",
                "timing": (
                    "a run's window: from the start of its first batch reading new records "
                    "past the warm-up batches to the start of the first past the timed ones "
                    "(the query's progress); s_per_batch: the window's wall time per "
                    "maxOffsetsPerTrigger new records read in it; settled_per_s: records "
                    "acked or dead-lettered in it (the spout's counts) per second"
                ),
            },
            "sizes": {
                size: {
                    "cases": {
                        v: {f: summarize(r) for f, r in by_fraction.items()}
                        for v, by_fraction in runs[size].items()
                    }
                }
                for size in sizes
            },
            "warmup_round_s_per_batch": warmup,
            "ratios": [r for size in sizes for r in ratios(runs[size], size)],
            "loadavg_end": loadavg(),
            "wall_s": time.time() - started,
        }
        failed = False
    finally:
        if own_session and spark is not None:
            spark.stop()
        stop_and_tidy(broker, workdir, failed, log, "checkpoints")
    print_tables(out)
    if not args.no_save:
        log(f"written to {save(out, args.output, 'failure-path')}")
    return out


if __name__ == "__main__":
    # a SIGTERM ends the run through main's finally block: the broker is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
