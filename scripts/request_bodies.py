#!/usr/bin/env python3
"""Recommendation request bodies from an `arc-rec export` file: one JSON line per exported
context with failures (its first three failures, its current configuration, k = 3), for
`arc-rec bench load --bodies`.

    request_bodies.py EXAMPLES.jsonl > bodies.jsonl
"""
import json
import sys

for line in open(sys.argv[1]):
    context = json.loads(line)["context"]
    if not context["failures"]:
        continue
    failures = [{"failure_category": f["failure_category"], "error_message": f["example"]}
                for f in context["failures"][:3]]
    print(json.dumps({"failure_context": {"failures": failures},
                      "current_config": context["current_config"], "k": 3}))
