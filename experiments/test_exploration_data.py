#!/usr/bin/env python3
"""Tests of experiments/exploration_data.py: prompt ids as `rft::dataset` numbers them, the decisions a
sample file adds, and the errors on samples of prompts it must not use."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exploration_data  # noqa: E402


def example(id, config, split, summary="3 of 4 runs failed", role="analyst", approved=True):
    return {
        "id": id,
        "org": "acme",
        "diff_id": id.split("/")[-1],
        "config_id": config,
        "split": split,
        "context": {
            "failure_summary": summary,
            "current_config": {"model": "m", "timeout_s": 2.0},
            "user_context": {"user_role": role, "domain": "fintech"},
        },
        "recommendation": {"type": "timeout_adjustment", "diff": {"timeout_s": 30.0}},
        "outcome": {"approval_status": "approved" if approved else "rejected"},
        "reward": {"total": 1.1, "binary": 1.0, "acceptance": 1.0},
    }


def sample(prompt_id, accepted, greedy=False, valid=True, temperature=0.3):
    completion = json.dumps({"type": "temperature", "diff": {"temperature": temperature}, "rationale": "r"})
    return {
        "model": "rl",
        "prompt_id": prompt_id,
        "greedy": greedy,
        "completion": completion,
        "accepted": accepted,
        "format_valid": valid,
    }


class ExplorationDataTest(unittest.TestCase):
    def setUp(self):
        # c1 has two user turns (another role), c2 one; the first of c1's second turn is held out.
        self.lines = [
            example("acme/b", "c1", "train"),
            example("acme/a", "c1", "train", approved=False),
            example("acme/d", "c1", "validation", role="lead"),
            example("acme/c", "c2", "train", summary="1 of 4 runs failed"),
        ]

    def test_prompt_ids_number_user_turns_per_configuration(self):
        first = exploration_data.first_examples(self.lines)
        self.assertEqual(sorted(first), ["acme/c1/1", "acme/c1/2", "acme/c2/1"])
        self.assertEqual(first["acme/c1/1"]["id"], "acme/a")  # the smallest id sets the split
        self.assertEqual(first["acme/c1/2"]["split"], "validation")
        self.assertEqual(first["acme/c2/1"]["id"], "acme/c")

    def test_samples_become_decisions_in_their_prompt(self):
        samples = [
            sample("acme/c1/1", True),
            sample("acme/c1/1", False, greedy=True),
            sample("acme/c2/1", False, temperature=0.7),
            sample("acme/c2/1", True, valid=False),
        ]
        added, skipped = exploration_data.augment(self.lines, samples, "x")
        self.assertEqual(skipped, 2)
        self.assertEqual([a["id"] for a in added], ["acme/a~x-1", "acme/c~x-3"])
        self.assertEqual([a["outcome"]["approval_status"] for a in added], ["approved", "rejected"])
        self.assertEqual(added[1]["recommendation"]["diff"], {"temperature": 0.7})
        self.assertEqual(added[1]["reward"]["binary"], -1.0)
        # The copy keeps its prompt's context and split, and the new id sorts after the prompt's.
        self.assertEqual(added[0]["context"], self.lines[1]["context"])
        self.assertTrue(all(a["split"] == "train" for a in added))
        self.assertGreater(added[0]["id"], "acme/a")
        # The source lines are untouched.
        self.assertEqual(self.lines[1]["outcome"]["approval_status"], "rejected")

    def test_held_out_and_unknown_prompts_are_refused(self):
        with self.assertRaisesRegex(SystemExit, "validation prompt"):
            exploration_data.augment(self.lines, [sample("acme/c1/2", True)], "x")
        with self.assertRaisesRegex(SystemExit, "not in the data"):
            exploration_data.augment(self.lines, [sample("acme/c9/1", True)], "x")

    def test_flip_swaps_the_splits(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            data, out = os.path.join(d, "data.jsonl"), os.path.join(d, "flipped.jsonl")
            exploration_data.write_lines(data, self.lines)
            self.assertEqual(exploration_data.flip(data, out), 4)
            flipped = exploration_data.read_lines(out)
            self.assertEqual(
                [line["split"] for line in flipped], ["test", "test", "validation", "test"]
            )


if __name__ == "__main__":
    unittest.main()
