"""JUnit XML: one test case per check, so CI systems show the checklist natively.

fail → <failure>; skip → <skipped> with the reason; warn passes with the message in <system-out>.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any


def render(doc: dict[str, Any]) -> str:
    checks = doc["checks"]
    suite = ET.Element(
        "testsuite",
        name=f"traceguard.{doc['profile']['name']}",
        tests=str(len(checks)),
        failures=str(sum(c["status"] == "fail" for c in checks)),
        skipped=str(sum(c["status"] == "skip" for c in checks)),
        errors="0",
        timestamp=doc["generated_at"],
    )
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="traceguard.checks", name=c["id"])
        if c["status"] == "fail":
            failure = ET.SubElement(case, "failure", message=c["message"], type="fail")
            failure.text = "\n".join(
                filter(
                    None,
                    [
                        c["message"],
                        f"Remedy: {c['remedy']}" if c.get("remedy") else None,
                        *(str(e) for e in c["evidence"][:10]),
                    ],
                )
            )
        elif c["status"] == "skip":
            ET.SubElement(case, "skipped", message=c["reason"] or "not available")
        elif c["status"] == "warn":
            ET.SubElement(case, "system-out").text = f"WARN: {c['message']}\nRemedy: {c.get('remedy') or ''}"
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
