"""The ``ackstream`` command (also ``python -m ackstream``), one module per command.

- ``ackstream demo`` (:mod:`.demo`): the main job on the embedded default (no broker).
- ``ackstream run FILE`` (:mod:`.run`): run a topology file with a local Spark session,
  wait for its queries, stop them cleanly on Ctrl-C, ``--timeout`` or ``--until-idle``.
- ``ackstream status`` (:mod:`.status`): pending, acked, failed, replayed and
  dead-lettered roots, complete-latency percentiles, rates over a window, failures by
  stage and lag per partition, read from a topology's channels (``--json``,
  ``--prometheus``).
- ``ackstream dead-letters list|replay`` (:mod:`.dead_letters`): read a topology's dead
  letters, send chosen ones back to their source topic.
- ``ackstream acker`` (:mod:`.acker`): a topology's acker query in a process of its own
  (the topology started with ``acker=False``), until stopped.
- ``ackstream bench [acker]`` (:mod:`.bench`): the benchmark from the source checkout.

:mod:`.parser` builds the parser and dispatches; :mod:`.arguments` holds the options
several commands share, :mod:`.exits` the exit statuses and one-line errors,
:mod:`.queries` the wait for the queries of ``run`` and ``acker``.

Options default to environment variables (shown in ``--help``). Errors are one line,
``ackstream: ...``, saying what failed and what to do. ``run`` and ``acker`` write
Spark's log, and the full text of an error, to a file the last line names (or to the
console with ``--verbose``).

Exit status (:data:`EXIT_STATUS`): 0 done; 1 a query or the topology file failed;
2 a usage error (an option, a file or folder named on the command line); 3 an
environment problem (Java, a broker that does not answer, a missing topic); 130
interrupted (Ctrl-C); ``bench`` exits as its benchmark does, ``run`` as the file's
own ``sys.exit()``.

Building the parser imports no Spark, pandas or Arrow: it imports only the chosen
command's module (:data:`~ackstream.cli.parser.COMMANDS`), so ``ackstream --help``
stays fast.
"""

from __future__ import annotations

from ackstream.cli.arguments import ONE_SHOT_BOOTSTRAP_TIMEOUT_MS, command_kafka_options
from ackstream.cli.exits import EXIT_STATUS
from ackstream.cli.parser import build_parser, main

__all__ = [
    "EXIT_STATUS",
    "ONE_SHOT_BOOTSTRAP_TIMEOUT_MS",
    "build_parser",
    "command_kafka_options",
    "main",
]
