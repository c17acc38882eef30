import sys

from ackstream.cli import main

sys.exit(main())
