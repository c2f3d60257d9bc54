"""How a run is told: one line per requirement and a summary, JUnit XML, JSON."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ._requirements import REQUIREMENTS
from ._runner import Report, Result

__all__ = ["list_lines", "result_line", "summary_line", "write_json", "write_junit"]


def list_lines() -> list[str]:
    """``sheetplane conformance --list``: one requirement a line, in registry order."""
    return [requirement.line() for requirement in REQUIREMENTS]


def result_line(result: Result) -> str:
    """``PASS SP-READ-3: title``, ``FAIL SP-READ-3: title -- evidence``, ``SKIP ... -- why``."""
    head = f"{result.status} {result.requirement.id}: {result.requirement.title}"
    return f"{head} -- {result.detail}" if result.detail else head


def summary_line(report: Report) -> str:
    """The closing line: counts, profile, prefix, seed, time, verdict."""
    counts = {status: 0 for status in ("PASS", "FAIL", "SKIP")}
    for result in report.results:
        counts[result.status] += 1
    verdict = "conforms" if report.passed else "DOES NOT CONFORM"
    return (
        f"{verdict}: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
        f"of {len(report.results)} requirements (profile {report.profile}, namespace prefix "
        f"{report.prefix}, seed {report.seed}, {report.seconds:.1f} s)"
    )


def _json(report: Report) -> dict[str, Any]:
    return {
        "profile": report.profile,
        "prefix": report.prefix,
        "seed": report.seed,
        "seconds": round(report.seconds, 3),
        "passed": report.passed,
        "results": [
            {
                "id": r.requirement.id,
                "title": r.requirement.title,
                "source": r.requirement.source,
                "profile": r.requirement.profile,
                "status": r.status,
                "detail": r.detail,
                "seconds": round(r.seconds, 3),
            }
            for r in report.results
        ],
    }


def write_json(report: Report, path: Path) -> None:
    """The report as one JSON document."""
    path.write_text(json.dumps(_json(report), indent=2) + "\n", encoding="utf-8")


def write_junit(report: Report, path: Path) -> None:
    """The report as JUnit XML: one ``testsuite``, one ``testcase`` per requirement."""
    failures = sum(r.status == "FAIL" for r in report.results)
    skipped = sum(r.status == "SKIP" for r in report.results)
    suites = ET.Element("testsuites", name="sheetplane conformance")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"sheetplane-conformance-{report.profile}",
        tests=str(len(report.results)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{report.seconds:.3f}",
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (("prefix", report.prefix), ("seed", str(report.seed))):
        ET.SubElement(properties, "property", name=name, value=value)
    for result in report.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"conformance.{result.requirement.profile}",
            name=f"{result.requirement.id}: {result.requirement.title}",
            time=f"{result.seconds:.3f}",
        )
        if result.status == "FAIL":
            failure = ET.SubElement(case, "failure", message=f"FAIL {result.requirement.id}")
            failure.text = result.detail
        elif result.status == "SKIP":
            ET.SubElement(case, "skipped", message=result.detail)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
