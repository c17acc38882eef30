"""What an operator sees of topologies, running or not: their status, their metrics and
the live view, all read from the channel, the checkpoint and the group's offsets.

- :mod:`ackstream.ui.status`: what became of a topology's roots (``ackstream
  status``), its lag, its stages' counts and the rows its stages hold, summed;
- :mod:`ackstream.ui.status_sources`: where those are read from (the channel, the
  checkpoint, the group's offsets);
- :mod:`ackstream.ui.metrics`: those figures as Prometheus metrics (``ackstream
  status --prometheus``, ``ackstream run --metrics-port``, the view's ``/metrics``);
- :mod:`ackstream.ui.view`: the live view, a web page of one or more topologies
  (``ackstream ui``, ``ackstream run --ui``).

The view's web server is imported with :mod:`ackstream.ui.view` alone: ``ackstream
status`` and :mod:`ackstream.testing` read the status without it.
"""
