"""The acker's shard count at a checkpoint URL, kept from a Spark Connect client.

    python tests/remote_shard_count.py CONNECT_URL CHECKPOINT_URL

Starts a Connect session, checks the count 2 twice (the first writes it, through a
Spark job: a Connect client has no JVM of its own) and then 3, and prints one JSON
line: ``{"refused": "<the error's text>" or null}``.
"""

from __future__ import annotations

import json
import sys

import ackstream
from ackstream.acker.query import check_shard_count
from ackstream.errors import OptionError


def main(url: str, checkpoint: str) -> None:
    spark = ackstream.local_session("remote-shard-count", remote=url)
    refused = None
    try:
        check_shard_count(spark, checkpoint, 2)
        check_shard_count(spark, checkpoint, 2)
        try:
            check_shard_count(spark, checkpoint, 3)
        except OptionError as error:
            refused = str(error)
    finally:
        spark.stop()
    print(json.dumps({"refused": refused}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
