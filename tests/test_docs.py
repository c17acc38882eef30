"""Every code example in README.md and docs/ runs here, in the order a reader meets it,
so an example that stops working fails the suite.

Sybil finds the examples in each Markdown file:

- ```` ```python ```` blocks (and ``<!-- invisible-code-block: python -->`` checks) run
  in one namespace per document, in this process, with the session's ``spark``;
- ```` ```python title="name.py" ```` blocks are files the reader saves: written to the
  document's working folder;
- ```` ```sh ```` blocks run with bash in that folder, as a reader's shell would, with
  the ``ackstream`` command of this interpreter and Kafka's tools on the PATH (Kafka's
  ``kafka-*.sh`` scripts, here small launchers of the same classes, from ``make kafka``'s
  jars). A block that starts ``python FILE`` is a program the reader stops with
  Ctrl-C: it runs in the background until a check calls ``stop_background()``;
- ``<!-- skip: next -->`` leaves the next block out (installing, ``make test`` itself).

The examples name the reader's brokers ``localhost:9092``; here that is the suite's
broker. Each document gets a fresh folder (and TMPDIR), and its topics are created by
its own examples, so a document runs once per broker.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from sybil import Region, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

from ackstream import read_dead_letters

from helpers import consume, wait_for

#: the examples run in the session's Spark and on its broker: system tests
pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: the brokers as the examples name them
EXAMPLE_BROKERS = "localhost:9092"
#: Kafka's command-line tools the examples use, and the class each script runs
KAFKA_TOOLS = {
    "kafka-topics.sh": "org.apache.kafka.tools.TopicCommand",
    "kafka-console-producer.sh": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer.sh": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-consumer-groups.sh": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
}
SHELL_TIMEOUT_S = 600


class Reader:
    """One document's reader: a working folder, a shell environment, the brokers, and
    the program left running in the background."""

    def __init__(self, folder: Path, bootstrap: str | None, classes: Path | None = None):
        self.folder, self.bootstrap = folder, bootstrap
        self.background: subprocess.Popen | None = None
        tmp = folder / "tmp"
        tmp.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACKSTREAM_")}
        path = [str(Path(sys.executable).parent), env.get("PATH", "")]
        if bootstrap:
            path.insert(0, str(kafka_tools(folder / "kafka-bin", classes)))
        self.env = {**env, "PATH": os.pathsep.join(path), "TMPDIR": str(tmp)}

    def text(self, source: str) -> str:
        return source.replace(EXAMPLE_BROKERS, self.bootstrap) if self.bootstrap else source

    def python(self, example) -> None:
        padded = "\n" * (example.line + example.parsed.line_offset) + self.text(example.parsed)
        exec(compile(padded, example.path, "exec", dont_inherit=True), example.namespace)
        example.namespace.pop("__builtins__", None)

    def save(self, example) -> None:
        name, source = example.parsed
        (self.folder / name).write_text(self.text(source))

    def shell(self, example) -> None:
        script = self.text(example.parsed)
        if script.startswith("python "):
            assert self.background is None, "one background program at a time"
            log = (self.folder / "background.log").open("w")
            self.background = subprocess.Popen(
                ["bash", "-c", script.strip()],
                cwd=self.folder,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches it alone
            )
            return
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT_S,
        )
        assert done.returncode == 0, (
            f"{example.path}:{example.line}: exit {done.returncode}\n{script}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )

    def stop_background(self) -> None:
        """Ctrl-C the background program, as the reader does; it must still be running."""
        running, self.background = self.background, None
        assert running is not None, "no background program"
        log = (self.folder / "background.log").read_text
        assert running.poll() is None, f"it ended by itself ({running.returncode}):\n{log()}"
        os.killpg(running.pid, signal.SIGINT)
        try:
            running.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(running.pid, signal.SIGKILL)
            running.wait(10)
            pytest.fail(f"Ctrl-C did not stop it within 60 s:\n{log()[-4000:]}")

    def close(self) -> None:
        if self.background is not None and self.background.poll() is None:
            os.killpg(self.background.pid, signal.SIGKILL)
            self.background.wait(10)


#: A tool's JVM: Kafka's scripts give tools a 256 MB heap; a tool runs for a second, so
#: little is compiled; and the classes the session's first tool run loaded are mapped from
#: the archive it wrote at its exit (class data sharing), which halves a start on 2 cores.
TOOL_LAUNCHER = """#!/bin/sh
jvm="java -Xmx256M -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
if [ -f "{classes}" ]; then
  exec $jvm -XX:SharedArchiveFile="{classes}" -cp "{libs}/*" {main} "$@"
fi
$jvm -XX:ArchiveClassesAtExit="{classes}.$$" -cp "{libs}/*" {main} "$@"
status=$?
if [ -f "{classes}.$$" ]; then mv "{classes}.$$" "{classes}"; fi
exit $status
"""


@pytest.fixture(scope="session")
def tool_classes(tmp_path_factory) -> Path:
    """Where the Kafka tools' launchers keep the archive of their loaded classes."""
    return tmp_path_factory.mktemp("kafka-tools") / "classes.jsa"


def kafka_tools(folder: Path, classes: Path) -> Path:
    """Launchers named as Kafka's scripts, running the same classes from the test jars
    (sharing the classes archived at ``classes``, see :data:`TOOL_LAUNCHER`)."""
    from broker import kafka_libs

    libs = kafka_libs()
    if not any(libs.glob("kafka-tools-*.jar")):
        pytest.fail(
            f"Kafka's tools are not in {libs}: run `make kafka` again (tests/kafka/pom.xml "
            "brings kafka-tools for the docs' examples)"
        )
    folder.mkdir()
    for script, main in KAFKA_TOOLS.items():
        path = folder / script
        path.write_text(TOOL_LAUNCHER.format(classes=classes, libs=libs, main=main))
        path.chmod(0o755)
    return folder


class FileBlockParser:
    """```` ```python title="name.py" ```` blocks: files the reader saves."""

    def __init__(self, evaluator):
        self.lexer = FencedCodeBlockLexer(
            language=r'\w+ title="[^"]+"', mapping={"language": "arguments", "source": "source"}
        )
        self.evaluator = evaluator

    def __call__(self, document):
        for region in self.lexer(document):
            name = re.search(r'title="([^"]+)"', region.lexemes["arguments"]).group(1)
            yield Region(region.start, region.end, (name, region.lexemes["source"]), self.evaluator)


def kafka_checks(bootstrap: str, reader: Reader) -> dict:
    """What the documents' invisible checks call, on the suite's brokers."""

    def ends(topic):
        consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        try:
            parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
            return consumer.end_offsets(parts)
        finally:
            consumer.close()

    def group_lag(group, topic):
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            committed = admin.list_group_offsets(group).get(group, {})
        finally:
            admin.close()
        return sum(
            end - (committed[tp].offset if tp in committed else 0)
            for tp, end in ends(topic).items()
        )

    def wait_for_lag_zero(group, topic, records):
        wait_for(
            lambda: sum(ends(topic).values()) == records and group_lag(group, topic) == 0,
            timeout=300,
            interval=0.25,
            what=f"group {group} to commit all {records} records of {topic}",
        )

    return {
        "dead_letter_reasons": lambda topic: (
            read_dead_letters(bootstrap=bootstrap, topic=topic).column("reason").to_pylist()
        ),
        "group_lag": group_lag,
        "wait_for_lag_zero": wait_for_lag_zero,
        "message_keys": lambda topic: [m.key.decode() for m in consume(bootstrap, topic)],
        "message_values": lambda topic: [m.value.decode() for m in consume(bootstrap, topic)],
        "stop_background": reader.stop_background,
    }


#: a shell line that starts Spark in a process of its own, as a reader would: ~15 s each
STARTS_SPARK = re.compile(r"^(ackstream (run|demo|acker)|python \S+\.py)", re.M)


def _example_pages():
    """The pages, those whose examples start Spark in processes of their own marked e2e
    (make test-e2e): they take minutes, not seconds."""
    for path in DOCUMENTS:
        marks = [pytest.mark.e2e] if STARTS_SPARK.search(path.read_text()) else []
        yield pytest.param(path, marks=marks, id=str(path.relative_to(ROOT)))


@pytest.mark.parametrize("path", list(_example_pages()))
def test_every_example_runs(path, request, tmp_path, monkeypatch):
    text = path.read_text()
    needs_kafka = EXAMPLE_BROKERS in text
    bootstrap = request.getfixturevalue("broker").bootstrap if needs_kafka else None
    classes = request.getfixturevalue("tool_classes") if needs_kafka else None
    reader = Reader(tmp_path, bootstrap, classes)
    sybil = Sybil(
        parsers=[
            CodeBlockParser("python", reader.python),
            FileBlockParser(reader.save),
            CodeBlockParser("sh", reader.shell),
            SkipParser(),
        ]
    )
    document = sybil.parse(path)
    if "```python" in text or "code-block: python" in text:
        document.namespace["spark"] = request.getfixturevalue("spark")
    if needs_kafka:
        document.namespace.update(kafka_checks(bootstrap, reader))
    monkeypatch.chdir(tmp_path)
    try:
        for example in document:
            example.evaluate()
        assert reader.background is None, "a background program was left running"
    finally:
        reader.close()
