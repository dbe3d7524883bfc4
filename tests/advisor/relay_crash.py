"""A relay process that SIGKILLs itself at a chosen point of its N-th send, for the outbox crash tests.

    python -m tests.advisor.relay_crash DATABASE_URL BOOTSTRAP (before_send|after_send) N

`before_send`: the attempt is committed, the message never leaves. `after_send`: the broker acknowledged
the message, the process dies before marking the row sent. Either way nothing else runs: SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys

from advisor.outbox import OutboxRelay, Published
from advisor.records import OutboxMessage
from ingest.acked import AckedPublisher
from twin.db import make_engine


class CrashingRelay(OutboxRelay):
    def __init__(self, *args: object, point: str, crash_at: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.point = point
        self.crash_at = crash_at
        self.sends = 0

    def send(self, row: OutboxMessage) -> Published:
        self.sends += 1
        if self.sends == self.crash_at and self.point == "before_send":
            os.kill(os.getpid(), signal.SIGKILL)
        published = super().send(row)
        if self.sends == self.crash_at and self.point == "after_send":
            os.kill(os.getpid(), signal.SIGKILL)
        return published


def main() -> None:
    url, bootstrap, point, crash_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    relay = CrashingRelay(make_engine(url), AckedPublisher(bootstrap), point=point, crash_at=crash_at)
    relay.publish_pending()
    sys.exit(3)  # not reached when the crash happens: the test checks for SIGKILL


if __name__ == "__main__":
    main()
