"""A recording stand-in for kubectl: logs each call and answers from a scenario file.

Installed on PATH as ``kubectl`` by the tests (see conftest.py). The scenario is JSON:
``{"rules": [{"when": ["substring", ...], "stdout": "...", "json": {...}, "rc": 0}]}``;
the first rule whose substrings all occur in the joined arguments answers; no match
answers nothing with exit 0. Each call is appended to the log as one JSON line:
``{"argv": [...], "body": <the JSON of a `-f FILE` argument, or null>}``.
"""

import json
import os
import sys


def body_of(argv: list[str]) -> object:
    if "-f" not in argv:
        return None
    with open(argv[argv.index("-f") + 1]) as file:
        return json.load(file)


def answer(argv: list[str]) -> dict:
    with open(os.environ["FAKE_KUBECTL_SCENARIO"]) as file:
        rules = json.load(file)["rules"]
    joined = " ".join(argv)
    return next((r for r in rules if all(part in joined for part in r["when"])), {})


def main() -> int:
    argv = sys.argv[1:]
    with open(os.environ["FAKE_KUBECTL_LOG"], "a") as log:
        log.write(json.dumps({"argv": argv, "body": body_of(argv)}) + "\n")
    rule = answer(argv)
    if "json" in rule:
        sys.stdout.write(json.dumps(rule["json"]))
    sys.stdout.write(rule.get("stdout", ""))
    sys.stderr.write(rule.get("stderr", ""))
    return int(rule.get("rc", 0))


if __name__ == "__main__":
    sys.exit(main())
