"""compute_score's side that needs no grader process: requests built from verl's arguments, the
result verl logs, and (with verl) that verl's own loader takes reward.py by path as an async
reward function. The grader process itself is exercised by tests/it/verl.rs against eval."""

import asyncio
import inspect
import os
import pathlib
import unittest
from unittest import mock

from arc_rec_verl import reward

from .helpers import have

REWARD_FILE = pathlib.Path(reward.__file__)
ROW = {
    "prompt_id": "acme/c1/1",
    "organization": "acme",
    "configuration_id": "c1",
    "current_configuration": '{"model":"m"}',
    "num_turns": 2,
    "rollout_reward_scores": {},
}


class Requests(unittest.TestCase):
    def test_a_row_becomes_a_checked_request(self):
        request = reward.request_of("arc-rec", '{"type": "temperature"}', dict(ROW, arc_rec_draw=9))
        self.assertEqual(
            request,
            {
                "prompt_id": "acme/c1/1",
                "completion": '{"type": "temperature"}',
                "data_source": "arc-rec",
                "organization": "acme",
                "configuration_id": "c1",
                "current_configuration": '{"model":"m"}',
                "draw": 9,
            },
        )

    def test_a_row_from_elsewhere_is_named(self):
        with self.assertRaisesRegex(reward.GraderError, "extra_info.prompt_id"):
            reward.request_of("gsm8k", "42", {"index": 3})
        with self.assertRaisesRegex(reward.GraderError, "extra_info.prompt_id"):
            reward.request_of("arc-rec", "42", None)

    def test_the_logged_result_keeps_the_reward_and_says_what_it_knows(self):
        answer = {"reward": -0.9, "accepted": False, "format_valid": True, "acceptance_probability": 0.25, "has_truth": True}
        self.assertEqual(
            reward.score_of(answer),
            {"score": -0.9, "accepted": 0.0, "format_valid": 1.0, "true_acceptance": 0.25},
        )
        malformed = {"reward": -1.0, "accepted": False, "format_valid": False, "acceptance_probability": None, "has_truth": True}
        self.assertEqual(reward.score_of(malformed)["true_acceptance"], 0.0)
        logged = {"reward": 1.1, "accepted": True, "format_valid": True, "acceptance_probability": None, "has_truth": False}
        self.assertNotIn("true_acceptance", reward.score_of(logged))

    def test_no_run_no_grader(self):
        with mock.patch.dict(os.environ, {}, clear=True), mock.patch.object(reward, "_process", None):
            with self.assertRaisesRegex(reward.GraderError, "ARC_REC_RUN"):
                asyncio.run(reward.compute_score("arc-rec", "x", "[]", ROW))

    def test_a_missing_binary_is_named(self):
        with self.assertRaisesRegex(reward.GraderError, "ARC_REC_BIN"):
            reward.GraderProcess("/nowhere", binary="/no/such/arc-rec")


@unittest.skipUnless(have("verl"), "verl is not installed (scripts/verl/setup.sh installs it into .venv-verl)")
class ThroughVerl(unittest.TestCase):
    def test_verl_loads_compute_score_by_path_as_an_async_reward_function(self):
        from omegaconf import OmegaConf
        from verl.trainer.ppo.reward import get_custom_reward_fn

        config = OmegaConf.create(
            {"reward": {"custom_reward_function": {"path": str(REWARD_FILE), "name": "compute_score"}}}
        )
        fn = get_custom_reward_fn(config)
        self.assertIsNotNone(fn)
        self.assertTrue(inspect.iscoroutinefunction(fn.args[0]))


if __name__ == "__main__":
    unittest.main()
