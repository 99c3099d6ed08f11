"""The job the end-to-end log tests run, and the exact bytes it writes (computed, not captured)."""

from __future__ import annotations

#: A Python job writing LINES lines alternately to stdout and stderr, paced evenly over SECONDS.
JOB = """
import sys, time
lines, seconds = {lines}, {seconds}
start = time.monotonic()
out, err = sys.stdout, sys.stderr
for i in range(lines):
    (out if i % 2 == 0 else err).write("line %06d %s\\n" % (i, "abcdefghij" * 2))
    if i % 250 == 249:
        out.flush(); err.flush()
        time.sleep(max(0.0, start + (i + 1) * seconds / lines - time.monotonic()))
out.flush(); err.flush()
open("{stamp}", "w").write("%.3f" % (time.monotonic() - start))
"""


def job(lines: int, seconds: float, stamp: str) -> str:
    """The job's source; it writes its own duration (seconds) to ``stamp`` at the end."""
    return JOB.format(lines=lines, seconds=seconds, stamp=stamp)


def expected(lines: int) -> tuple[bytes, bytes]:
    """(stdout, stderr) exactly as the job writes them."""
    rows = [b"line %06d %s\n" % (i, b"abcdefghij" * 2) for i in range(lines)]
    return b"".join(rows[0::2]), b"".join(rows[1::2])
