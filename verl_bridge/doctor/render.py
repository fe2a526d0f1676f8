"""Text, JSON and bug-report (markdown) output of the doctor."""

from __future__ import annotations

import getpass
import json
import os
import platform
import re
import socket
import sys

from .result import ERROR, OK, WARN, CheckResult

MARKS = {OK: "✓", WARN: "!", ERROR: "✗"}
ASCII_MARKS = {OK: "ok", WARN: "!", ERROR: "x"}


def _marks() -> dict[str, str]:
    enc = (getattr(sys.stdout, "encoding", None) or "").lower()
    try:
        "✓✗".encode(enc or "ascii")
        return MARKS
    except (LookupError, UnicodeEncodeError):
        return ASCII_MARKS


def text_report(results: list[CheckResult], verbose: bool = False, elapsed: float | None = None) -> str:
    marks = _marks()
    width = max(len(r.id) for r in results) if results else 10
    lines: list[str] = []
    for r in results:
        lines.append(f"{marks[r.status]} {r.id:<{width}}  {r.summary}")
        if r.status != OK and r.fix:
            for i, fix_line in enumerate(r.fix.splitlines()):
                lines.append(f"    {'fix: ' if i == 0 else '     '}{fix_line}")
        if verbose:
            for ev in r.evidence:
                lines.append(f"    · {ev}")
    counts = {s: sum(r.status == s for r in results) for s in (OK, WARN, ERROR)}
    tail = f"{len(results)} checks: {counts[OK]} ok, {counts[WARN]} warnings, {counts[ERROR]} errors"
    if elapsed is not None:
        tail += f" ({elapsed:.1f} s)"
    lines.append(tail)
    return "\n".join(lines)


def json_report(results: list[CheckResult]) -> str:
    return json.dumps({"checks": [r.to_dict() for r in results]}, indent=2)


def redact(text: str) -> str:
    """Remove the user name, home directory, host name and anything that looks like a secret."""
    home = os.path.expanduser("~")
    if home and home != "/":
        text = text.replace(home, "~")
    try:
        user = getpass.getuser()
    except Exception:
        user = ""
    if user and len(user) > 2:
        text = re.sub(rf"\b{re.escape(user)}\b", "<user>", text)
    host = socket.gethostname()
    if host and len(host) > 2:
        text = text.replace(host, "<host>")
    text = re.sub(r"(?i)\b(token|secret|password|api[_-]?key)\b(\s*[=:]\s*)\S+", r"\1\2<redacted>", text)
    text = re.sub(r"\b(hf_[A-Za-z0-9]{10,}|ghp_[A-Za-z0-9]{10,}|sk-[A-Za-z0-9]{10,})\b", "<redacted>", text)
    return text


def issue_report(results: list[CheckResult], versions: dict[str, str | None]) -> str:
    marks = _marks()
    lines = [
        "### Environment (from `verl-bridge doctor --issue`)",
        "",
        f"- Python {platform.python_version()} on {platform.system()} {platform.machine()} ({platform.libc_ver()[0] or 'libc ?'})",
    ]
    for name, v in versions.items():
        lines.append(f"- {name}: {v or 'not installed'}")
    lines += ["", "| check | status | summary |", "|---|---|---|"]
    for r in results:
        summary = r.summary.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.id} | {marks[r.status]} {r.status} | {summary} |")
    problems = [r for r in results if r.status != OK]
    if problems:
        lines += ["", "### Problems and suggested fixes", ""]
        for r in problems:
            lines.append(f"- **{r.id}** ({r.status}): {r.summary}")
            if r.fix:
                lines += ["  ```", *(f"  {line}" for line in r.fix.splitlines()), "  ```"]
    lines += ["", "<details><summary>Evidence</summary>", "", "```"]
    for r in results:
        for ev in r.evidence:
            lines.append(f"[{r.id}] {ev}")
    lines += ["```", "", "</details>"]
    return redact("\n".join(lines))
