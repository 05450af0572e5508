"""What pytest's JUnit XML says of one test: the one reading of a <testcase> that the
support table (tools/support_table.py) and the GPU check's report (tools/gpu_report.py)
share."""

from __future__ import annotations

import xml.etree.ElementTree as ET


def outcome(case: ET.Element) -> tuple[str, str]:
    """(passed, failed, error, skipped or xfailed; the first line of its message)."""
    result, message = "passed", ""
    for child in case:
        if child.tag not in ("failure", "error", "skipped"):
            continue
        result = {"failure": "failed"}.get(child.tag, child.tag)
        if child.tag == "skipped" and "xfail" in child.get("type", "") + child.get("message", ""):
            result = "xfailed"
        text = (child.get("message", "") or (child.text or "")).strip()
        message = text.splitlines()[0] if text else ""
    return result, message
