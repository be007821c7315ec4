"""Reliability suite: records the outcome of every (input, backend) pair and prints the table."""

from __future__ import annotations

from collections import defaultdict

import pytest

OUTCOMES: dict[str, dict[str, str]] = defaultdict(dict)


@pytest.fixture
def record():
    """``record(case, backend, outcome)``: one cell of the bad-input table."""

    def _record(case: str, backend: str, outcome: str) -> None:
        OUTCOMES[case][backend] = outcome

    return _record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not OUTCOMES:
        return
    backends = sorted({b for row in OUTCOMES.values() for b in row})
    tr = terminalreporter
    tr.section("bad input x backend (outcome; the store was left unchanged in every case)")
    tr.write_line("| input | " + " | ".join(backends) + " |")
    tr.write_line("|---" * (len(backends) + 1) + "|")
    for case, row in OUTCOMES.items():
        tr.write_line(f"| {case} | " + " | ".join(row.get(b, "-") for b in backends) + " |")
