"""arc-rec's estimators in Python against the Rust figures (tests/fixtures/advantages.json, which
objectives/tests/verl_fixture.rs keeps equal to the objectives crate), directly and, where verl is
installed, through verl's own registry (``get_adv_estimator_fn``)."""

import json
import pathlib
import random
import unittest

from arc_rec_verl import estimators

from .helpers import have

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "advantages.json"
NAMES = {
    "mean": estimators.MEAN,
    "pass@k": estimators.PASS_AT_K,
    "biased-pass@k": estimators.BIASED_PASS_AT_K,
}
TOLERANCE = 1e-9


def cases():
    return json.loads(FIXTURE.read_text())["cases"]


class Config(dict):
    """What verl passes as ``config`` (its AlgoConfig and DictConfig both have ``get``)."""


def batch(case_list, seed):
    """The fixture's groups as one verl batch: each response's score on its last valid token,
    responses of different lengths, groups interleaved in a shuffled order."""
    import torch

    rng = random.Random(seed)
    entries = []
    for group, case in enumerate(case_list):
        for position, reward in enumerate(case["rewards"]):
            entries.append((f"uid-{group}", group, position, reward))
    rng.shuffle(entries)
    length = 7
    rewards = torch.zeros(len(entries), length, dtype=torch.float64)
    mask = torch.zeros(len(entries), length, dtype=torch.float32)
    for row, (_, _, _, reward) in enumerate(entries):
        valid = rng.randint(1, length)
        mask[row, :valid] = 1.0
        rewards[row, valid - 1] = reward
    index = [uid for uid, _, _, _ in entries]
    return entries, rewards, mask, index


class GroupMath(unittest.TestCase):
    def test_every_fixture_case_matches_the_rust_advantages(self):
        checked = 0
        for case in cases():
            for key, name in NAMES.items():
                got = estimators.group_advantages(name, case["rewards"], case["k"])
                want = case["advantages"][key]
                self.assertEqual(len(got), len(want))
                for a, b in zip(got, want):
                    self.assertLessEqual(abs(a - b), TOLERANCE, (name, case))
                checked += 1
        self.assertGreater(checked, 100)

    def test_bad_groups_are_named(self):
        with self.assertRaisesRegex(ValueError, "smaller than k = 4"):
            estimators.group_advantages(estimators.PASS_AT_K, [1.0, -1.0], 4)
        with self.assertRaisesRegex(ValueError, "finite"):
            estimators.group_advantages(estimators.MEAN, [1.0, float("nan")], 2)
        with self.assertRaisesRegex(ValueError, "integer"):
            estimators.k_of(Config(arc_rec_k="four"))

    def test_k_comes_from_the_config_then_the_environment(self):
        from unittest import mock

        with mock.patch.dict("os.environ", {"ARC_REC_K": "6"}):
            self.assertEqual(estimators.k_of(Config(arc_rec_k=8)), 8)
            self.assertEqual(estimators.k_of(Config()), 6)
        with mock.patch.dict("os.environ", {}, clear=True):
            self.assertEqual(estimators.k_of(Config()), estimators.DEFAULT_K)
            self.assertEqual(estimators.k_of(None), estimators.DEFAULT_K)


@unittest.skipUnless(have("torch"), "torch is not installed")
class VerlLayout(unittest.TestCase):
    """The verl-facing functions on token-level tensors, without verl."""

    def check(self, lookup):
        for k in (2, 4):
            chosen = [c for c in cases() if c["k"] == k]
            entries, rewards, mask, index = batch(chosen, seed=k)
            for key, name in NAMES.items():
                advantages, returns = lookup(name)(
                    token_level_rewards=rewards, response_mask=mask, index=index, config=Config(arc_rec_k=k)
                )
                self.assertEqual(tuple(advantages.shape), tuple(rewards.shape))
                self.assertTrue((advantages == returns).all())
                # Zero outside the response, one value on every response token.
                self.assertTrue((advantages[mask == 0] == 0).all())
                for row, (_, group, position, _) in enumerate(entries):
                    want = chosen[group]["advantages"][key][position]
                    tokens = advantages[row][mask[row] == 1]
                    self.assertLessEqual(float((tokens - want).abs().max()), TOLERANCE, (name, row))

    def test_the_estimators_fill_every_response_token_with_the_group_advantage(self):
        self.check(lambda name: estimators.ESTIMATORS[name])


@unittest.skipUnless(have("verl"), "verl is not installed (scripts/verl/setup.sh installs it into .venv-verl)")
class ThroughVerl(VerlLayout):
    """The same, with the functions verl's trainer would call: looked up in its registry."""

    def test_the_estimators_fill_every_response_token_with_the_group_advantage(self):
        import arc_rec_verl
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn

        self.assertEqual(sorted(arc_rec_verl.REGISTERED), sorted(NAMES.values()))
        self.check(get_adv_estimator_fn)

    def test_verls_rloo_is_arc_recs_mean_times_n(self):
        # A check of what verl's contract means, on verl's own estimator: RLOO's
        # r_i - mean(others) is n times arc-rec's mean advantage.
        import numpy as np
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn

        chosen = [c for c in cases() if c["k"] == 2]
        entries, rewards, mask, index = batch(chosen, seed=3)
        rloo, _ = get_adv_estimator_fn("rloo")(
            token_level_rewards=rewards.float(), response_mask=mask, index=np.array(index, dtype=object), config=Config()
        )
        for row, (_, group, position, _) in enumerate(entries):
            n = len(chosen[group]["rewards"])
            want = n * chosen[group]["advantages"]["mean"][position]
            got = rloo[row][mask[row] == 1]
            self.assertLessEqual(float((got - want).abs().max()), 1e-5, row)


if __name__ == "__main__":
    unittest.main()
