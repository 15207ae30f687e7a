#!/usr/bin/env python3
"""Counts an iscsi-test-cu log the strict way and prints one JSON object.

Each suite.test is counted once. It FAILED if CUnit failed it or it printed "[FAILED]" (CUnit
counts some of those as passed); it was SKIPPED if it printed "[SKIPPED]"; otherwise it is a real
pass. One libiscsi test prints "[FAILED]" for every correct target: iSCSIdatasn.iSCSIDataSnInvalid
sends Data-Out PDUs with wrong DataSNs, asserts that the WRITE does not succeed, but calls the
helper with "expect GOOD", which prints "[FAILED]" whenever the status is not GOOD (and when the
connection drops instead). When its CUnit assertions pass it is reported apart, as
"by_design", and not counted as a failure.
"""
import json
import re
import sys

BY_DESIGN = {"iSCSIdatasn.iSCSIDataSnInvalid"}
CUNIT_FAILED = re.compile(r"(?<!\[)FAILED(?!\])")


def parse(text):
    tests, order, suite, current = {}, [], "", None
    for line in text.splitlines():
        m = re.match(r"^Suite: (.*)$", line)
        if m:
            suite, current = m.group(1).strip(), None
            continue
        m = re.match(r"^\s+Test: (\S+) \.\.\.(.*)$", line)
        if m:
            current = f"{suite}.{m.group(1)}"
            if current not in tests:
                tests[current] = []
                order.append(current)
            tests[current].append(m.group(2))
            continue
        if line.startswith("Run Summary"):
            current = None
        elif current is not None:
            tests[current].append(line)
    result = {"tests": len(order), "real_passes": 0, "skipped": 0, "failed": [], "by_design": []}
    for name in order:
        body = "\n".join(tests[name])
        printed_failed = "[FAILED]" in body
        cunit_failed = bool(CUNIT_FAILED.search(body))
        if cunit_failed or (printed_failed and name not in BY_DESIGN):
            result["failed"].append(name)
        elif printed_failed:
            result["by_design"].append(name)
        elif "[SKIPPED]" in body:
            result["skipped"] += 1
        else:
            result["real_passes"] += 1
    return result


if __name__ == "__main__":
    with open(sys.argv[1], errors="replace") as f:
        print(json.dumps(parse(f.read())))
