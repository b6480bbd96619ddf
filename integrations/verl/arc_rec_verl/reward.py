"""verl's ``compute_score``, answered by arc-rec's own graders.

There is no second implementation of a grader here: ``compute_score`` sends each completion to a
long-lived ``arc-rec grade serve --run RUN_DIR`` process (JSON lines over its stdin and stdout)
and returns the reward that process computed, the reward ``arc-rec train`` and ``arc-rec eval``
compute for the same completion and draw key.

Configuration, from the environment (ship it to verl's workers in the Ray runtime env):

- ``ARC_REC_RUN``: the run directory whose data, grader settings and (learned) fit grade
  (required);
- ``ARC_REC_BIN``: the ``arc-rec`` binary (default: ``arc-rec`` on ``PATH``);
- ``ARC_REC_GRADER``: ``world``, ``logged`` or ``learned`` (default: the run's grader);
- ``ARC_REC_SEED``: the draw key of the world's acceptance draws (default 1, as ``eval --seed``).
  A row's ``extra_info.arc_rec_draw`` overrides it.

With ``--world-reward sampled`` runs one draw key means one verdict per (prompt, answer) for the
whole verl run; arc-rec's recipe for verl therefore trains with ``--world-reward expected``
(docs/SCALE-OUT.md).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import itertools
import json
import os
import shutil
import subprocess
import threading
from typing import Any, Iterable

DATA_SOURCE = "arc-rec"


class GraderError(RuntimeError):
    """The grader process refused a request or died."""


class GraderProcess:
    """One ``arc-rec grade serve`` process; thread-safe, pipelined batches."""

    def __init__(self, run: str, binary: str | None = None, grader: str | None = None, seed: int | None = None):
        binary = binary or "arc-rec"
        resolved = shutil.which(binary) if os.sep not in binary else binary
        if resolved is None or not os.path.exists(resolved):
            raise GraderError(f"ARC_REC_BIN: cannot find the arc-rec binary {binary!r}")
        command = [resolved, "grade", "serve", "--run", str(run)]
        if grader:
            command += ["--grader", grader]
        if seed is not None:
            command += ["--seed", str(int(seed))]
        self.command = command
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1 << 16,
        )
        self._stderr = collections.deque(maxlen=50)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def _drain_stderr(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self._stderr.append(line.rstrip("\n"))

    def _died(self) -> GraderError:
        code = self._process.poll()
        self._stderr_thread.join(timeout=2)
        tail = "\n".join(self._stderr)
        return GraderError(f"{' '.join(self.command)} exited ({code}): {tail}")

    def grade_many(self, requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Sends the requests as one pipelined batch; answers in request order. An answer with
        an ``error`` raises ``GraderError`` naming it."""
        requests = list(requests)
        if not requests:
            return []
        with self._lock:
            ids = []
            lines = []
            for request in requests:
                request = dict(request)
                request["id"] = next(self._ids)
                ids.append(request["id"])
                lines.append(json.dumps(request, ensure_ascii=False))
            try:
                assert self._process.stdin is not None
                self._process.stdin.write("\n".join(lines) + "\n")
                self._process.stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._died() from None
            answers = []
            assert self._process.stdout is not None
            for _ in ids:
                line = self._process.stdout.readline()
                if not line:
                    raise self._died()
                answers.append(json.loads(line))
        for want, answer, request in zip(ids, answers, requests):
            if answer.get("id") != want:
                raise GraderError(f"answer {answer.get('id')!r} came for request {want}: out of order")
            if "error" in answer:
                raise GraderError(f"prompt {request.get('prompt_id')!r}: {answer['error']}")
        return answers

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                assert self._process.stdin is not None
                self._process.stdin.close()
                self._process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()


_process: GraderProcess | None = None
_process_lock = threading.Lock()


def grader_process() -> GraderProcess:
    """This process's grader, started on first use from the environment."""
    global _process
    with _process_lock:
        if _process is None:
            run = os.environ.get("ARC_REC_RUN")
            if not run:
                raise GraderError("ARC_REC_RUN is not set: name the arc-rec run directory whose grader scores")
            seed = os.environ.get("ARC_REC_SEED")
            _process = GraderProcess(
                run,
                binary=os.environ.get("ARC_REC_BIN"),
                grader=os.environ.get("ARC_REC_GRADER") or None,
                seed=int(seed) if seed else None,
            )
            atexit.register(_process.close)
        return _process


def request_of(data_source: str, solution_str: str, extra_info: dict | None) -> dict[str, Any]:
    """The grader request for one verl sample: the row's ids go along and are checked against
    the run's prompt."""
    extra_info = extra_info or {}
    prompt_id = extra_info.get("prompt_id")
    if not prompt_id:
        raise GraderError(
            "extra_info.prompt_id is missing: the rows must come from `arc-rec export --format verl`"
        )
    request: dict[str, Any] = {
        "prompt_id": prompt_id,
        "completion": solution_str,
        "data_source": data_source,
    }
    for field in ("organization", "configuration_id", "current_configuration"):
        if extra_info.get(field) is not None:
            request[field] = extra_info[field]
    if extra_info.get("arc_rec_draw") is not None:
        request["draw"] = int(extra_info["arc_rec_draw"])
    return request


def score_of(answer: dict[str, Any]) -> dict[str, Any]:
    """verl's result dict: ``score`` is the reward; the rest is logged per sample."""
    result = {
        "score": float(answer["reward"]),
        "accepted": float(bool(answer["accepted"])),
        "format_valid": float(bool(answer["format_valid"])),
    }
    if answer.get("has_truth"):
        probability = answer.get("acceptance_probability")
        result["true_acceptance"] = 0.0 if probability is None else float(probability)
    return result


def compute_score_sync(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict[str, Any]:
    """The synchronous form (verl runs it in a thread pool)."""
    request = request_of(data_source, solution_str, extra_info)
    return score_of(grader_process().grade_many([request])[0])


class _Batcher:
    """Collects the requests of one event-loop turn and grades them as one batch."""

    def __init__(self) -> None:
        self.pending: list[tuple[dict[str, Any], asyncio.Future]] = []

    async def grade(self, request: dict[str, Any]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((request, future))
        if len(self.pending) == 1:
            loop.call_soon(lambda: asyncio.ensure_future(self._flush()))
        return await future

    async def _flush(self) -> None:
        batch, self.pending = self.pending, []
        loop = asyncio.get_running_loop()
        try:
            answers = await loop.run_in_executor(None, grader_process().grade_many, [r for r, _ in batch])
        except Exception as error:  # every waiter learns why
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), answer in zip(batch, answers):
            if not future.done():
                future.set_result(answer)


_batchers: dict[int, _Batcher] = {}


async def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict[str, Any]:
    """verl's ``reward.custom_reward_function`` (async: the samples verl scores concurrently go
    to the grader process in one batch)."""
    request = request_of(data_source, solution_str, extra_info)
    batcher = _batchers.setdefault(id(asyncio.get_running_loop()), _Batcher())
    return score_of(await batcher.grade(request))


def _main() -> None:
    """``python -m arc_rec_verl.reward --rows ROWS.jsonl --samples SAMPLES.jsonl``: scores
    ``arc-rec eval --samples-out``'s completions through ``compute_score`` with each prompt's
    row as verl would pass it; prints one JSON line per sample (its reward, and eval's)."""
    import argparse

    parser = argparse.ArgumentParser(description=_main.__doc__)
    parser.add_argument("--rows", required=True, help="arc-rec export --format verl output")
    parser.add_argument("--samples", required=True, help="arc-rec eval --samples-out output")
    args = parser.parse_args()
    rows = {}
    with open(args.rows, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows[row["extra_info"]["prompt_id"]] = row
    with open(args.samples, encoding="utf-8") as f:
        samples = [json.loads(line) for line in f if line.strip()]

    async def score_all():
        calls = []
        for sample in samples:
            row = rows.get(sample["prompt_id"])
            if row is None:
                raise SystemExit(f"--rows has no row for prompt {sample['prompt_id']!r}")
            extra_info = dict(row["extra_info"], arc_rec_draw=sample["draw"])
            calls.append(
                compute_score(row["data_source"], sample["completion"], row["reward_model"]["ground_truth"], extra_info)
            )
        return await asyncio.gather(*calls)

    for sample, result in zip(samples, asyncio.run(score_all())):
        print(json.dumps({"prompt_id": sample["prompt_id"], "eval_reward": sample["reward"], **result}))


if __name__ == "__main__":
    _main()
