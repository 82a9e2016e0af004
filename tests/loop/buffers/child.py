"""The other process in the contract tests: ``python -m tests.loop.buffers.child``

consume URL GROUP NAME N TIMEOUT_S   poll up to N steps, print ``DELIVERED n``, then
                                     wait (uncommitted) to be killed
produce URL EPISODES STEPS           publish EPISODES x STEPS steps (episodes p0, p1,
                                     ...), flush, print ``PUBLISHED n``
"""

from __future__ import annotations

import sys
import time

from loop.buffers import open_consumer, open_producer
from tests.loop.buffers.contract import drain, episode


def main(argv: list[str]) -> None:
    if argv[0] == "consume":
        url, group, name, n, timeout_s = argv[1:]
        consumer = open_consumer(url, group, name)
        got = drain(consumer, int(n), float(timeout_s))
        print("DELIVERED", len(got), flush=True)
        time.sleep(600)  # killed here, before any commit
    elif argv[0] == "produce":
        url, episodes, steps, prefix = [*argv[1:], "p"][:4]
        producer = open_producer(url)
        for e in range(int(episodes)):
            producer.publish(episode(f"{prefix}{e}", int(steps)))
        producer.flush()
        producer.close()
        print("PUBLISHED", producer.counts.published, flush=True)
    else:
        sys.exit(f"unknown command {argv[0]!r}: use consume or produce")


if __name__ == "__main__":
    main(sys.argv[1:])
