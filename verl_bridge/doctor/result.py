"""The result of one check: status, summary, evidence and the command that fixes it."""

from __future__ import annotations

from dataclasses import dataclass, field

OK, WARN, ERROR = "ok", "warn", "error"
_RANK = {OK: 0, WARN: 1, ERROR: 2}


@dataclass
class CheckResult:
    id: str
    status: str
    summary: str
    fix: str = ""
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "status": self.status,
            "summary": self.summary,
            "fix": self.fix,
            "evidence": list(self.evidence),
        }


def worst(*statuses: str) -> str:
    return max(statuses, key=lambda s: _RANK[s], default=OK)


class Findings:
    """Collects problems found by one check; ``result()`` folds them into one CheckResult.

    The summary is the most severe problem first; every problem's fix is kept, one per line.
    """

    def __init__(self, check_id: str) -> None:
        self.check_id = check_id
        self.problems: list[tuple[str, str, str]] = []  # (status, message, fix)
        self.evidence: list[str] = []

    def add(self, status: str, message: str, fix: str = "") -> None:
        self.problems.append((status, message, fix))

    def note(self, line: str) -> None:
        self.evidence.append(line)

    def result(self, ok_summary: str) -> CheckResult:
        if not self.problems:
            return CheckResult(self.check_id, OK, ok_summary, "", self.evidence)
        ordered = sorted(self.problems, key=lambda p: -_RANK[p[0]])
        status = ordered[0][0]
        summary = "; ".join(msg for _, msg, _ in ordered)
        fixes: list[str] = []
        for _, _, fix in ordered:
            for line in fix.splitlines():
                if line and line not in fixes:
                    fixes.append(line)
        return CheckResult(self.check_id, status, summary, "\n".join(fixes), self.evidence)
