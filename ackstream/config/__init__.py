"""The ``ackstream`` source's options, each declared once.

- :mod:`ackstream.config.source`: the table of options (``OPTIONS``), parsed into a
  frozen ``SourceConfig``; the options page of the docs is made from the same table;
- :mod:`ackstream.config.options`: how one row of that table is declared, and how an
  option's text becomes a value (durations, whole numbers, flags, choices).
"""
