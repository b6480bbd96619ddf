"""The peers of `arc-rec bench bandit --peers`: Vowpal Wabbit's contextual bandit with
action-dependent features and MABWiser's LinTS, ranking the same candidate lists as arc-rec from
the same information the platform sends, as a JSON-lines process the benchmark drives.

Protocol (one JSON object per line each way, answers in order):
  {"round": r, "context": {...}, "candidates": [{"key", "type", "diff"}, ...]}
      -> {"round": r, "choices": {policy: {"index": i, "probability": p}}, "seen": {policy: [keys]}}
     context = {"failures": [{"category", "message", "tool"}], "current_config": {...},
                "user_role": str|null, "domain": str|null}
     `seen` lists the keys of the candidates each policy scored, so the benchmark can prove
     every policy saw the list arc-rec ranked.
  {"learn": [{"round", "policy", "index", "accepted"}]}   -> {"learned": n}
      each refers to a round answered earlier (the benchmark delivers feedback in batches)
  {"warm": [{"context", "candidates", "index", "accepted"}]}   -> {"warmed": n}
      the platform's logged decisions, before round 0: each policy learns that candidate
      `index` of the list was shown (probability unknown, taken as 1) and the answer; not timed
  {"stats": true} -> {"seconds": {policy: seconds spent choosing and learning}}
Ends at the end of stdin. Policies: vw-squarecb, vw-epsilon, vw-regcb, vw-bag, mabwiser-lints.

Features (the same for every peer; VW hashes them, LinTS gets them hashed into a fixed vector):
shared = failure categories, failing tools, message words, the configuration's model, temperature
and tool count, the user's role and domain; action = recommendation type, each changed key, the
direction and size of each numeric change, the model switched to. VW crosses them (-q SA).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import sys
import time

WORD = re.compile(r"[a-z][a-z_]{2,}")
POLICIES = ("vw-squarecb", "vw-epsilon", "vw-regcb", "vw-bag", "mabwiser-lints")
VW_ARGS = {
    "vw-squarecb": "--cb_explore_adf --squarecb -q SA",
    "vw-epsilon": "--cb_explore_adf --epsilon 0.05 -q SA",
    "vw-regcb": "--cb_explore_adf --regcbopt -q SA",
    "vw-bag": "--cb_explore_adf --bag 5 -q SA",
}
#: Dimension of LinTS's hashed context vector.
LINTS_DIM = 48


def token(text) -> str:
    """A VW-safe feature name (no spaces, colons or bars)."""
    return re.sub(r"[\s:|]+", "_", str(text))


def shared_features(context: dict) -> list[str]:
    features = []
    for failure in context.get("failures") or []:
        features.append("cat=" + token(failure.get("category")))
        if failure.get("tool"):
            features.append("tool=" + token(failure["tool"]))
        for word in WORD.findall(str(failure.get("message") or "").lower())[:20]:
            features.append("w=" + word)
    config = context.get("current_config") or {}
    if "model" in config:
        features.append("model=" + token(config["model"]))
    if isinstance(config.get("temperature"), (int, float)):
        features.append(f"temperature:{float(config['temperature']):.4g}")
    if isinstance(config.get("tools"), list):
        features.append(f"tools:{len(config['tools'])}")
    for key in ("user_role", "domain"):
        if context.get(key):
            features.append(f"{key}=" + token(context[key]))
    return features


def action_features(candidate: dict, config: dict) -> list[str]:
    features = ["type=" + token(candidate.get("type"))]
    diff = candidate.get("diff") or {}
    for key, new in sorted(diff.items()):
        features.append("key=" + token(key))
        old = config.get(key)
        if key == "model" and isinstance(new, str):
            features.append("to_model=" + token(new))
        elif isinstance(new, (int, float)) and isinstance(old, (int, float)):
            change = float(new) - float(old)
            features.append(("up_" if change > 0 else "down_") + token(key))
            features.append(f"d_{token(key)}:{change:.4g}")
        elif isinstance(new, dict):
            for sub in sorted(new):
                features.append(f"key={token(key)}.{token(sub)}")
        elif isinstance(new, list):
            features.append(f"n_{token(key)}:{len(new)}")
    return features


def hashed_vector(features: list[str], dim: int) -> list[float]:
    vector = [0.0] * dim
    for feature in features:
        name, _, value = feature.partition(":")
        weight = float(value) if value else 1.0
        digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
        slot = int.from_bytes(digest[:4], "little") % dim
        sign = 1.0 if digest[4] & 1 else -1.0
        vector[slot] += sign * weight
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


class VwPolicy:
    def __init__(self, name: str, seed: int):
        from vowpalwabbit import pyvw

        self.vw = pyvw.Workspace(f"{VW_ARGS[name]} --quiet --random_seed {seed}")
        self.rng = random.Random(seed)
        self.pending: dict[int, tuple[list[str], list[float]]] = {}

    def lines(self, shared: list[str], actions: list[list[str]]) -> list[str]:
        return ["shared |S " + " ".join(shared)] + ["|A " + " ".join(a) for a in actions]

    def choose(self, round_: int, shared, actions) -> tuple[int, float]:
        lines = self.lines(shared, actions)
        pmf = self.vw.predict(lines)
        total = sum(pmf)
        draw = self.rng.random() * total
        index = len(pmf) - 1
        for i, p in enumerate(pmf):
            draw -= p
            if draw < 0:
                index = i
                break
        self.pending[round_] = (lines, pmf)
        return index, pmf[index] / total, len(pmf)

    def learn(self, round_: int, index: int, accepted: bool) -> None:
        lines, pmf = self.pending.pop(round_)
        self.learn_lines(lines, index, accepted, max(pmf[index], 1e-6))

    def learn_lines(self, lines: list[str], index: int, accepted: bool, probability: float) -> None:
        labelled = list(lines)
        cost = 0.0 if accepted else 1.0
        labelled[index + 1] = f"0:{cost}:{probability} " + lines[index + 1]
        self.vw.learn(labelled)

    def warm(self, shared, actions, index: int, accepted: bool) -> None:
        self.learn_lines(self.lines(shared, actions), index, accepted, 1.0)


class LinTsPolicy:
    """MABWiser LinTS with one arm per distinct candidate (arms added as they appear), each
    arm's posterior sampled and the best available one shown."""

    def __init__(self, seed: int):
        from mabwiser.mab import MAB, LearningPolicy

        self.MAB, self.LearningPolicy, self.seed = MAB, LearningPolicy, seed
        self.mab = None
        self.rng = random.Random(seed)
        self.pending: dict[int, tuple[list[str], list[float]]] = {}

    def choose(self, round_: int, keys: list[str], context: list[float]) -> tuple[int, float]:
        self.pending[round_] = (keys, context)
        if self.mab is None:
            return self.rng.randrange(len(keys)), 1.0 / len(keys), len(keys)
        for key in keys:
            if key not in self.mab.arms:
                self.mab.add_arm(key)
        expectations = self.mab.predict_expectations([context])
        scored = [i for i in range(len(keys)) if keys[i] in expectations]
        best = max(scored, key=lambda i: (expectations[keys[i]], -i))
        return best, 1.0, len(scored)

    def learn(self, round_: int, index: int, accepted: bool) -> None:
        keys, context = self.pending.pop(round_)
        self.warm(keys, context, index, accepted)

    def warm(self, keys: list[str], context: list[float], index: int, accepted: bool) -> None:
        decision, reward = keys[index], 1.0 if accepted else 0.0
        if self.mab is None:
            self.mab = self.MAB(
                arms=list(dict.fromkeys(keys)),
                learning_policy=self.LearningPolicy.LinTS(alpha=1.0),
                seed=self.seed,
            )
            self.mab.fit([decision], [reward], [context])
        else:
            if decision not in self.mab.arms:
                self.mab.add_arm(decision)
            self.mab.partial_fit([decision], [reward], [context])


def main() -> int:
    parser = argparse.ArgumentParser(description="arc-rec bench bandit's peer policies (JSON lines)")
    parser.add_argument("--policies", required=True, help=f"comma-separated, of {', '.join(POLICIES)}")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    names = [n for n in args.policies.split(",") if n]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        print(f"--policies: unknown {unknown}; choose from {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    try:
        policies = {
            name: (LinTsPolicy(args.seed) if name == "mabwiser-lints" else VwPolicy(name, args.seed)) for name in names
        }
    except ImportError as missing:
        # `arc-rec bench bandit --peers` shows this line as the reason the peers are missing.
        print(
            f"peers: {sys.executable} cannot import {missing.name} ({missing}); scripts/setup.sh "
            "installs vowpalwabbit and mabwiser into .venv (not with ARC_REC_PYTHON_PEERS=0)",
            file=sys.stderr,
        )
        return 2
    seconds = {name: 0.0 for name in names}
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "round" in message:
            round_ = int(message["round"])
            context = message["context"]
            candidates = message["candidates"]
            config = context.get("current_config") or {}
            shared = shared_features(context)
            actions = [action_features(c, config) for c in candidates]
            keys = [c["key"] for c in candidates]
            choices, seen = {}, {}
            for name, policy in policies.items():
                started = time.perf_counter()
                if isinstance(policy, LinTsPolicy):
                    vector = hashed_vector(shared, LINTS_DIM)
                    index, probability, scored = policy.choose(round_, keys, vector)
                else:
                    index, probability, scored = policy.choose(round_, shared, actions)
                seconds[name] += time.perf_counter() - started
                choices[name] = {"index": index, "probability": probability}
                # What the policy scored: a model that dropped or added an action shows here.
                seen[name] = keys[:scored]
            out.write(json.dumps({"round": round_, "choices": choices, "seen": seen}) + "\n")
        elif "learn" in message:
            for item in message["learn"]:
                name = item["policy"]
                started = time.perf_counter()
                policies[name].learn(int(item["round"]), int(item["index"]), bool(item["accepted"]))
                seconds[name] += time.perf_counter() - started
            out.write(json.dumps({"learned": len(message["learn"])}) + "\n")
        elif "warm" in message:
            for item in message["warm"]:
                context, candidates = item["context"], item["candidates"]
                config = context.get("current_config") or {}
                shared = shared_features(context)
                index, accepted = int(item["index"]), bool(item["accepted"])
                for policy in policies.values():
                    if isinstance(policy, LinTsPolicy):
                        keys = [c["key"] for c in candidates]
                        policy.warm(keys, hashed_vector(shared, LINTS_DIM), index, accepted)
                    else:
                        policy.warm(shared, [action_features(c, config) for c in candidates], index, accepted)
            out.write(json.dumps({"warmed": len(message["warm"])}) + "\n")
        elif "stats" in message:
            out.write(json.dumps({"seconds": seconds}) + "\n")
        else:
            out.write(json.dumps({"error": f"unknown message with keys {sorted(message)}"}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
