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
    verified: bool = True  # False: an import probe did not finish, the status is "unknown" (shown as warn)
    required: bool = False  # an unverified required component (torch, megatron-core) fails the doctor

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "status": self.status,
            "summary": self.summary,
            "fix": self.fix,
            "evidence": list(self.evidence),
            "verified": self.verified,
        }

    @property
    def blocking(self) -> bool:
        """Makes the doctor exit 1 without --strict: an error, or an unknown required component."""
        return self.status == ERROR or (not self.verified and self.required)


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
        self.unverified = False
        self.required = False

    def unknown(self, message: str, fix: str, required: bool = False) -> None:
        """A probe that did not finish: never "ok"; for a required component it fails the doctor."""
        self.unverified = True
        self.required = self.required or required
        self.add(WARN, message, fix)

    def add(self, status: str, message: str, fix: str = "") -> None:
        self.problems.append((status, message, fix))

    def note(self, line: str) -> None:
        self.evidence.append(line)

    def result(self, ok_summary: str) -> CheckResult:
        if not self.problems:
            return CheckResult(self.check_id, OK, ok_summary, "", self.evidence)
        res = self._fold()
        res.verified = not self.unverified
        res.required = self.required
        return res

    def _fold(self) -> CheckResult:
        ordered = sorted(self.problems, key=lambda p: -_RANK[p[0]])
        status = ordered[0][0]
        summary = "; ".join(msg for _, msg, _ in ordered)
        fixes: list[str] = []
        for _, _, fix in ordered:
            for line in fix.splitlines():
                if line and line not in fixes:
                    fixes.append(line)
        return CheckResult(self.check_id, status, summary, "\n".join(fixes), self.evidence)
