"""bench/peers.py as `arc-rec bench bandit --peers` drives it: the protocol, the lists each policy
scored, and that each policy learns (on a synthetic task where one candidate type is always
accepted, every VW configuration comes to show it). Run: .venv/bin/python bench/test_peers.py"""

import json
import pathlib
import random
import subprocess
import sys
import unittest

PEERS = pathlib.Path(__file__).with_name("peers.py")
VW = ["vw-squarecb", "vw-epsilon", "vw-regcb", "vw-bag"]


def rounds(n, seed):
    rng = random.Random(seed)
    for r in range(n):
        size = rng.randint(3, 7)
        good_at = rng.randrange(size)
        good = None
        candidates = []
        for j in range(size):
            kind = "retry_policy" if j == good_at else rng.choice(["temperature", "model_switch", "timeout_adjustment"])
            diff = {"retry": {"max_attempts": 3}} if j == good_at else {"temperature": round(rng.random(), 2)}
            # Keys as arc-rec makes them: the same type and diff, the same key.
            key = kind + ":" + json.dumps(diff, sort_keys=True)
            if any(c["key"] == key for c in candidates):
                continue
            candidates.append({"key": key, "type": kind, "diff": diff})
            if j == good_at:
                good = len(candidates) - 1
        context = {
            "failures": [{"category": "timeout", "message": "web_search timed out after 5000 ms", "tool": "web_search"}],
            "current_config": {"model": "openai/gpt-4.1", "temperature": 0.7, "tools": [{"name": "web_search"}]},
            "user_role": "ml_engineer",
            "domain": "fintech",
        }
        yield {"round": r, "context": context, "candidates": candidates}, good


class Peers(unittest.TestCase):
    def drive(self, policies, n, batch=20, warm=0):
        process = subprocess.Popen(
            [sys.executable, str(PEERS), "--policies", ",".join(policies), "--seed", "7"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

        def call(message):
            process.stdin.write(json.dumps(message) + "\n")
            process.stdin.flush()
            return json.loads(process.stdout.readline())

        if warm:
            # A log: in each past context the good candidate was approved and another rejected.
            logged = []
            for message, good in rounds(warm, seed=5):
                other = (good + 1) % len(message["candidates"])
                for index in (good, other):
                    logged.append(
                        {"context": message["context"], "candidates": message["candidates"], "index": index, "accepted": index == good}
                    )
            self.assertEqual(call({"warm": logged}), {"warmed": len(logged)})
        picks = {p: [] for p in policies}
        pending = []
        for message, good in rounds(n, seed=11):
            answer = call(message)
            keys = [c["key"] for c in message["candidates"]]
            for policy in policies:
                self.assertEqual(answer["seen"][policy], keys, policy)
                index = answer["choices"][policy]["index"]
                self.assertTrue(0 <= index < len(keys))
                self.assertTrue(0 < answer["choices"][policy]["probability"] <= 1)
                picks[policy].append(index == good)
                pending.append({"round": message["round"], "policy": policy, "index": index, "accepted": index == good})
            if len(pending) >= batch * len(policies):
                self.assertEqual(call({"learn": pending}), {"learned": len(pending)})
                pending = []
        seconds = call({"stats": True})["seconds"]
        self.assertEqual(sorted(seconds), sorted(policies))
        self.assertIn("error", call({"what": 1}))
        process.stdin.close()
        self.assertEqual(process.wait(timeout=30), 0)
        return picks

    def test_vw_learns_the_always_accepted_type(self):
        picks = self.drive(VW, 600)
        for policy, hits in picks.items():
            late = sum(hits[-200:]) / 200
            early = sum(hits[:50]) / 50
            self.assertGreater(late, 0.7, policy)
            self.assertGreater(late, early, policy)

    def test_lints_learns_the_always_accepted_candidate(self):
        hits = self.drive(["mabwiser-lints"], 300)["mabwiser-lints"]
        # Every new temperature is a new arm it must try once, so it learns slower than VW.
        self.assertGreater(sum(hits[-100:]) / 100, 0.4)
        self.assertGreater(sum(hits[-100:]), sum(hits[:100]))

    def test_a_warm_start_teaches_every_policy_before_the_first_round(self):
        policies = VW + ["mabwiser-lints"]
        cold = self.drive(policies, 50, batch=1000)
        warm = self.drive(policies, 50, batch=1000, warm=300)
        for policy in VW:
            self.assertGreater(sum(warm[policy]) / 50, 0.7, policy)
            self.assertGreater(sum(warm[policy]), sum(cold[policy]), policy)
        # LinTS's arms are candidates: only the good one (always the same diff) recurs.
        self.assertGreater(sum(warm["mabwiser-lints"]), sum(cold["mabwiser-lints"]))

    def test_unknown_policies_are_named(self):
        result = subprocess.run(
            [sys.executable, str(PEERS), "--policies", "vw-squarecb,nope"], capture_output=True, text=True
        )
        self.assertEqual(result.returncode, 2)
        self.assertIn("nope", result.stderr)


if __name__ == "__main__":
    unittest.main()
