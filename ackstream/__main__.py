"""``python -m ackstream``: the ``ackstream`` command."""

import sys

from ackstream.cli import main

if __name__ == "__main__":
    sys.exit(main())
