#!/usr/bin/env python3
"""Client-side halves of scripts/fault-tests.sh's checks (standard library only).

    fault_checks.py replica URL_A URL_B KEY BODIES [TRIALS]
        Feedback sent to server A must change server B's rankings: per trial, B's mean scores
        of the candidates it shows for one request body are read, one answer is sent to A, and B
        is polled until a mean score changed. Prints JSON with each trial's delay in seconds.
    fault_checks.py revocation URL_A URL_B KEY BODIES
        After the key was revoked (stdin is read first: the caller writes a line when it has
        revoked it), both servers are polled until they answer 401. Prints the delays.
    fault_checks.py same-metrics RUN_A RUN_B
        The two runs' metrics.jsonl agree, line by line, except for timings. Exit status 1 if not.
"""

import json
import sys
import time
import urllib.error
import urllib.request


def post(url, key, body):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None


def mean_scores(url, key, body, requests=5):
    scores = {}
    for _ in range(requests):
        status, answer = post(f"{url}/v1/recommendations", key, body)
        if status != 200:
            raise SystemExit(f"{url} answered {status}")
        for item in answer["recommendations"]:
            scores[item["recommendation_id"]] = item["explanation"]["mean_score"]
    return scores


def replica(url_a, url_b, key, bodies, trials=5):
    body = json.loads(open(bodies).readline())
    delays = []
    for _ in range(int(trials)):
        before = mean_scores(url_b, key, body)
        status, answer = post(f"{url_a}/v1/recommendations", key, body)
        assert status == 200, status
        shown = answer["recommendations"][0]["recommendation_id"]
        status, _ = post(
            f"{url_a}/v1/feedback",
            key,
            {"event_id": answer["event_id"], "recommendation_id": shown, "outcome": "accepted"},
        )
        assert status == 201, status
        sent = time.monotonic()
        delay = None
        while time.monotonic() - sent < 30:
            after = mean_scores(url_b, key, body, requests=1)
            if any(abs(after[r] - before[r]) > 1e-12 for r in after if r in before):
                delay = time.monotonic() - sent
                break
            time.sleep(0.05)
        delays.append(None if delay is None else round(delay, 3))
    print(json.dumps({"trials": len(delays), "delays_s": delays}))


def revocation(url_a, url_b, key, bodies):
    body = json.loads(open(bodies).readline())
    for url in (url_a, url_b):
        status, _ = post(f"{url}/v1/recommendations", key, body)
        assert status == 200, f"{url} refused the key before revocation: {status}"
    print("ready", flush=True)
    sys.stdin.readline()
    revoked = time.monotonic()
    delays = {}
    while len(delays) < 2 and time.monotonic() - revoked < 120:
        for name, url in (("a", url_a), ("b", url_b)):
            if name not in delays:
                status, _ = post(f"{url}/v1/recommendations", key, body)
                if status == 401:
                    delays[name] = round(time.monotonic() - revoked, 3)
        time.sleep(0.25)
    print(json.dumps({"delays_s": delays}), flush=True)


def same_metrics(run_a, run_b):
    def timeless(value):
        if isinstance(value, dict):
            return {k: timeless(v) for k, v in value.items()
                    if k not in ("step_seconds", "tokens_per_second")}
        if isinstance(value, list):
            return [timeless(v) for v in value]
        return value

    def lines(run):
        return [timeless(json.loads(line)) for line in open(f"{run}/metrics.jsonl")]

    a, b = lines(run_a), lines(run_b)
    if a != b:
        print(f"metrics differ: {len(a)} vs {len(b)} lines", file=sys.stderr)
        sys.exit(1)
    print(len(a))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"replica": replica, "revocation": revocation, "same-metrics": same_metrics}[command](*args)
