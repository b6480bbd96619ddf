#!/usr/bin/env bash
# verl PPO with arc-rec's estimator and grader, on the Ray cluster this node belongs to (or a
# local one): the recipe of docs/SCALE-OUT.md, with arc-rec's `train` defaults. Not run by any
# test (it needs GPUs, vLLM and Ray); every value can be overridden from the environment, and
# extra Hydra overrides go after the arguments.
#
#   WARMUP_RUN=runs/warm TRAIN_ROWS=verl/train.jsonl VAL_ROWS=verl/validation.jsonl \
#   ARC_REC_BIN=target/release/arc-rec NNODES=1 GPUS_PER_NODE=8 scripts/verl/run_ppo.sh [hydra overrides...]
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${WARMUP_RUN:?WARMUP_RUN: the arc-rec run whose warm-up model verl trains (arc-rec train --steps 0)}"
: "${TRAIN_ROWS:?TRAIN_ROWS: arc-rec export --format verl --split train}"
: "${VAL_ROWS:?VAL_ROWS: arc-rec export --format verl --split validation}"
ARC_REC_BIN="$(realpath "${ARC_REC_BIN:-target/release/arc-rec}")"
MODEL="${MODEL:-$WARMUP_RUN/warmup-model}"
OUT="${OUT:-checkpoints/verl}"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-1}"
# arc-rec train's defaults (arc-rec train --help): k 4, n 8, 4 prompts a step, 200 steps, LoRA
# r 16 / alpha 32 on all seven projections, lr 2e-3, temperature 1, 128 new tokens, clip 0.2,
# one update epoch, no KL penalty (arc-rec's k3 penalty is verl's low_var_kl).
K="${K:-4}"
N="${N:-8}"
PROMPTS_PER_STEP="${PROMPTS_PER_STEP:-4}"
STEPS="${STEPS:-200}"
LORA_R="${LORA_R:-16}"
LORA_ALPHA="${LORA_ALPHA:-32}"
LR="${LR:-2e-3}"
KL_COEF="${KL_COEF:-0}"
ESTIMATOR="${ESTIMATOR:-arc_rec_pass@k}"

[ -x .venv-verl/bin/python ] || { echo "run_ppo: no .venv-verl; run scripts/verl/setup.sh first" >&2; exit 1; }
[ -x "$ARC_REC_BIN" ] || { echo "run_ppo: ARC_REC_BIN $ARC_REC_BIN is not an executable (cargo build --release)" >&2; exit 1; }
[ -d "$MODEL" ] || { echo "run_ppo: MODEL $MODEL is not a checkpoint directory" >&2; exit 1; }

# The grader process and the estimators' k reach verl's Ray workers through the environment;
# VERL_USE_EXTERNAL_MODULES makes each worker import arc_rec_verl (which registers the
# estimators). On a multi-node cluster, submit with `ray job submit --runtime-env-json` carrying
# the same env_vars and integrations/verl as working_dir (docs/SCALE-OUT.md).
export ARC_REC_RUN="$(realpath "$WARMUP_RUN")" ARC_REC_BIN ARC_REC_K="$K"
export VERL_USE_EXTERNAL_MODULES=arc_rec_verl
export PYTHONPATH="$PWD/integrations/verl${PYTHONPATH:+:$PYTHONPATH}"

use_kl_loss=False
if [ "$KL_COEF" != "0" ]; then use_kl_loss=True; fi

exec .venv-verl/bin/python -m verl.trainer.main_ppo \
  algorithm.adv_estimator="$ESTIMATOR" \
  +algorithm.arc_rec_k="$K" \
  data.train_files="$TRAIN_ROWS" data.val_files="$VAL_ROWS" \
  data.train_batch_size="$PROMPTS_PER_STEP" \
  data.max_prompt_length=1024 data.max_response_length=128 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.lora_rank="$LORA_R" actor_rollout_ref.model.lora_alpha="$LORA_ALPHA" \
  actor_rollout_ref.model.target_modules=all-linear \
  actor_rollout_ref.actor.optim.lr="$LR" \
  actor_rollout_ref.actor.ppo_mini_batch_size="$PROMPTS_PER_STEP" \
  actor_rollout_ref.actor.ppo_epochs=1 actor_rollout_ref.actor.clip_ratio=0.2 \
  actor_rollout_ref.actor.use_kl_loss="$use_kl_loss" \
  actor_rollout_ref.actor.kl_loss_coef="$KL_COEF" actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.checkpoint.save_contents='[model,optimizer,extra]' \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n="$N" \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.load_format=safetensors actor_rollout_ref.rollout.layered_summon=True \
  reward.custom_reward_function.path="$PWD/integrations/verl/arc_rec_verl/reward.py" \
  reward.custom_reward_function.name=compute_score \
  trainer.total_training_steps="$STEPS" trainer.save_freq=20 trainer.test_freq=20 \
  trainer.default_local_dir="$OUT" trainer.logger='[console]' \
  trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE" \
  "$@"
