"""arc-rec's leave-one-out advantage estimators, for verl's ``register_adv_est``.

The same estimators as arc-rec's ``objectives`` crate (``objectives/src/advantage.rs``), on one
group of n samples with scalar rewards:

- ``arc_rec_pass@k``: f = max over k-subsets, unbiased leave-one-out (PKPO's s^(loo-1) for
  n > k, Tang et al.'s estimator at n = k); with the plan's +/-1 rewards, pass@k.
- ``arc_rec_biased_pass@k``: the same minus its group mean (lower variance, biased).
- ``arc_rec_mean``: f = mean, A_i = (r_i - mean of the others) / n (RLOO scaled by 1/n).

maj@k is not registered: its advantage needs each sample's canonical answer, and a verl
estimator sees only the rewards and the prompt uid (``compute_advantage`` in
``verl/trainer/ppo/ray_trainer.py`` passes ``non_tensor_batch`` to GDPO alone).

The group math is plain Python floats (float64), so it needs neither verl nor torch; the verl
wrappers need torch, and registering needs verl (``register()``, called on import when verl is
importable).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from math import comb
from typing import Callable, Sequence

#: The k of arc-rec's defaults (``arc-rec train --k``).
DEFAULT_K = 4

#: Names under which the estimators are registered with verl (``algorithm.adv_estimator=...``).
PASS_AT_K = "arc_rec_pass@k"
BIASED_PASS_AT_K = "arc_rec_biased_pass@k"
MEAN = "arc_rec_mean"


def mean_loo(rewards: Sequence[float]) -> list[float]:
    """A_i = (n r_i - sum r) / (n (n - 1)): r_i minus the mean of the others, over n."""
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    total = sum(rewards)
    return [(n * r - total) / (n * (n - 1.0)) for r in rewards]


def max_loo(rewards: Sequence[float], k: int) -> list[float]:
    """f = max: with the rewards sorted ascending (ties by position) into g_1..g_n,
    A_p = (1 / C(n, k)) * sum over q < p of C(q - 1, k - 2) * (g_p - g_q)."""
    n = len(rewards)
    advantages = [0.0] * n
    if k < 2 or n < k:
        return advantages
    order = sorted(range(n), key=lambda i: (rewards[i], i))
    total = comb(n, k)
    weight = 0.0
    weighted = 0.0
    for position, index in enumerate(order):
        g = rewards[index]
        advantages[index] = weight * g - weighted
        w = comb(position, k - 2) / total
        weight += w
        weighted += w * g
    return advantages


def center(values: Sequence[float]) -> list[float]:
    """The values minus their mean."""
    if not values:
        return []
    mean = sum(values) / len(values)
    return [v - mean for v in values]


def group_advantages(name: str, rewards: Sequence[float], k: int) -> list[float]:
    """One group's advantages under estimator ``name`` (one of the registered names)."""
    rewards = [float(r) for r in rewards]
    for index, r in enumerate(rewards):
        if r != r or r in (float("inf"), float("-inf")):
            raise ValueError(f"reward {index} of a group is {r}: rewards must be finite")
    if name == MEAN:
        if len(rewards) < 2:
            raise ValueError(f"{name}: a group of {len(rewards)} sample(s); leave-one-out needs n >= 2")
        return mean_loo(rewards)
    if k < 2:
        raise ValueError(f"{name}: k = {k}; leave-one-out needs k >= 2")
    if len(rewards) < k:
        raise ValueError(
            f"{name}: a group of {len(rewards)} samples is smaller than k = {k} "
            "(set actor_rollout_ref.rollout.n >= k)"
        )
    if name == PASS_AT_K:
        return max_loo(rewards, k)
    if name == BIASED_PASS_AT_K:
        return center(max_loo(rewards, k))
    raise ValueError(f"unknown arc-rec estimator {name!r}")


def k_of(config) -> int:
    """k: ``algorithm.arc_rec_k`` when the config has it (Hydra ``+algorithm.arc_rec_k=4``), else
    the environment's ``ARC_REC_K`` (ship it in the Ray runtime env), else arc-rec's default."""
    value = None
    if config is not None:
        getter = getattr(config, "get", None)
        value = getter("arc_rec_k", None) if callable(getter) else getattr(config, "arc_rec_k", None)
    if value is None:
        value = os.environ.get("ARC_REC_K", DEFAULT_K)
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"arc_rec_k / ARC_REC_K must be an integer, got {value!r}") from None
    return k


def _verl_estimator(name: str) -> Callable:
    """The verl estimator of ``name``: (advantages, returns), each (bs, L), the group's
    advantage of each response on every response token (verl's outcome-reward contract)."""

    def estimator(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        import torch

        if index is None:
            raise ValueError(f"{name}: verl passed no uid index; groups cannot be formed")
        k = k_of(config)
        scores = token_level_rewards.sum(dim=-1)
        groups: "OrderedDict[object, list[int]]" = OrderedDict()
        for position, uid in enumerate(index):
            groups.setdefault(uid, []).append(position)
        flat = scores.detach().to("cpu", torch.float64).tolist()
        advantages = [0.0] * len(flat)
        for positions in groups.values():
            values = group_advantages(name, [flat[p] for p in positions], k)
            for p, a in zip(positions, values):
                advantages[p] = a
        column = torch.tensor(advantages, dtype=torch.float64, device=scores.device)
        result = (column.unsqueeze(-1) * response_mask.to(torch.float64)).to(token_level_rewards.dtype)
        return result, result

    estimator.__name__ = "compute_" + name.replace("@", "_at_").replace("-", "_") + "_advantage"
    estimator.__doc__ = f"arc-rec's {name} estimator (see arc_rec_verl.estimators)."
    return estimator


#: The verl-facing estimator functions, by registered name.
ESTIMATORS = {name: _verl_estimator(name) for name in (PASS_AT_K, BIASED_PASS_AT_K, MEAN)}


def register() -> list[str]:
    """Registers the estimators with verl's ``ADV_ESTIMATOR_REGISTRY`` (idempotent)."""
    from verl.trainer.ppo.core_algos import register_adv_est

    for name, fn in ESTIMATORS.items():
        register_adv_est(name)(fn)
    return list(ESTIMATORS)
