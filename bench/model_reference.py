"""PyTorch reference benchmark for arc-rec's model: what transformers + peft achieve on this device.

Measures, on CUDA when available (bf16) or the CPU (f32):
  generate_batch1   `generate` at batch 1, greedy, fixed prompt, exactly --new-tokens new tokens
  generate_k        `generate` with num_return_sequences=k, sampled at temperature 1 (no top-k/p),
                    counting all k * new-tokens tokens
  lora_train_step   forward + backward + AdamW step on the LoRA parameters (r=16, alpha=32, all
                    seven projections) over a batch of --train-batch (default k) sequences of
                    --train-len tokens, counting train-batch * train-len tokens per step
  rl_step           one RL step: generate k completions of the prompt (sampled at temperature 1,
                    exactly --new-tokens each), then one policy-gradient step on those k sequences
                    through the LoRA adapters: loss = -sum_i A_i * (sum of completion-token
                    log-probs), A = +1, -1, +1, ..., backward, grad-norm clip 1, AdamW; counting
                    generated (k * new) + trained (k * (prompt + new)) tokens per step
Each figure is a median over timed repetitions after warm-up, with torch.cuda.synchronize() around
every timing and torch.cuda.max_memory_allocated() per phase. Prints ONE JSON object on stdout
(settings and figures) so `arc-rec bench model` can run it and compute ratios; progress goes to
stderr.

Model: --checkpoint DIR (a Hugging Face checkpoint), --shape qwen2.5-7b or qwen2.5-0.5b
(random-initialised Qwen2.5 shapes, built directly on the device), or --tiny (a random 2-layer
Qwen2 for tests). Generation runs on the LoRA-wrapped model (adapters unmerged, as during RL
rollouts) unless --generate-without-lora (which rl_step ignores: it samples from the policy).
"""

import argparse
import json
import platform
import statistics
import sys
import time

try:
    import peft
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM
except ImportError as missing:
    # `arc-rec bench model` shows this line as the reason the ratios are missing.
    raise SystemExit(
        f"model_reference: {sys.executable} cannot import {missing.name} ({missing}); "
        "install torch 2.11, transformers and peft into it (pip install transformers peft)"
    ) from None

PHASES = ["generate_batch1", "generate_k", "lora_train_step", "rl_step"]

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

SHAPES = {
    # Qwen2.5-7B's config.json, minus the tokenizer ids (random weights need none).
    "qwen2.5-7b": dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    # Qwen2.5-0.5B's config.json: an RL step fits a CPU in f32 (494M parameters, 2 GB).
    "qwen2.5-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # Small enough that every phase runs in seconds on a CPU.
    "tiny": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
    ),
}


def log(message):
    print(f"model_reference: {message}", file=sys.stderr, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="Hugging Face checkpoint directory")
    source.add_argument("--shape", choices=sorted(SHAPES), help="random-initialised model of these shapes")
    source.add_argument("--tiny", action="store_true", help="same as --shape tiny")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, help="new tokens per sequence (default 128 on CUDA, 16 on CPU)")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt (and training batch size by default)")
    parser.add_argument("--train-batch", type=int, help="sequences per training step (default: --k)")
    parser.add_argument("--train-len", type=int, help="tokens per training sequence (default 512 on CUDA, 64 on CPU)")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=1, help="untimed repetitions of each phase")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions of each phase")
    parser.add_argument(
        "--gradient-checkpointing",
        choices=["auto", "on", "off"],
        default="auto",
        help="auto: on for models over 1B parameters (the 7B shape); training phases only",
    )
    parser.add_argument("--generate-without-lora", action="store_true", help="generate with the bare base model")
    parser.add_argument(
        "--phases", default=",".join(PHASES), help="comma-separated subset to run"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch intra-op CPU threads (default: torch's own choice)")
    return parser.parse_args(argv)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def timed(device, warmup, repeats, step):
    """Runs step() warmup + repeats times; returns the timed runs' seconds and the last result."""
    result = None
    for _ in range(warmup):
        result = step()
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        result = step()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds, result


def load_model(args, device, dtype):
    if args.checkpoint:
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=dtype).to(device)
        return model, args.checkpoint
    shape = "tiny" if args.tiny else args.shape
    config = Qwen2Config(**SHAPES[shape])
    # Built on the device in its dtype: a 7B model initialised on the CPU in f32 would take
    # minutes and 30 GB before moving.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model, f"random {shape}"


def generate_phase(model, device, args, prompt, num_sequences, sample):
    kwargs = dict(
        max_new_tokens=args.new_tokens,
        # min_new_tokens = max_new_tokens: EOS cannot end a sequence early, so the count is exact.
        min_new_tokens=args.new_tokens,
        do_sample=sample,
        num_return_sequences=num_sequences,
        pad_token_id=0,
        use_cache=True,
    )
    if sample:
        # Plain temperature-1 sampling from the full distribution, as the RL rollouts do.
        kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
    attention_mask = torch.ones_like(prompt)

    def step():
        with torch.inference_mode():
            return model.generate(input_ids=prompt, attention_mask=attention_mask, **kwargs)

    reset_peak(device)
    seconds, output = timed(device, args.warmup, args.repeats, step)
    new_tokens = output.shape[1] - prompt.shape[1]
    if output.shape[0] != num_sequences or new_tokens != args.new_tokens:
        raise SystemExit(f"generate returned {tuple(output.shape)}, expected {num_sequences} x {args.new_tokens} new")
    tokens = num_sequences * new_tokens
    median = statistics.median(seconds)
    return {
        "sequences": num_sequences,
        "prompt_tokens": prompt.shape[1],
        "new_tokens_per_sequence": new_tokens,
        "tokens_per_run": tokens,
        "do_sample": sample,
        "seconds": seconds,
        "seconds_median": median,
        "tokens_per_s": tokens / median,
        "max_memory_allocated_bytes": peak_bytes(device),
    }


def train_phase(model, device, args, checkpointing):
    generator = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    batch = torch.randint(
        0, model.config.vocab_size, (args.train_batch, args.train_len), generator=generator
    ).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    losses = []

    def step():
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())

    reset_peak(device)
    seconds, _ = timed(device, args.warmup, args.repeats, step)
    model.eval()
    if checkpointing:
        model.gradient_checkpointing_disable()
    tokens = args.train_batch * args.train_len
    median = statistics.median(seconds)
    return {
        "batch": args.train_batch,
        "sequence_tokens": args.train_len,
        "tokens_per_step": tokens,
        "trainable_parameters": sum(p.numel() for p in trainable),
        "gradient_checkpointing": checkpointing,
        "optimizer": f"AdamW(lr={args.lr})",
        "losses": losses,
        "seconds": seconds,
        "seconds_median": median,
        "tokens_per_s": tokens / median,
        "max_memory_allocated_bytes": peak_bytes(device),
    }


def rl_phase(model, device, args, prompt, checkpointing):
    """One RL step per repetition: k sampled completions, then a policy-gradient step on them."""
    k, prompt_len, new_tokens = args.k, prompt.shape[1], args.new_tokens
    trainable = [p for p in model.parameters() if p.requires_grad]
    # torch's AdamW defaults (weight decay 0.01) are arc-rec's trainer defaults too.
    optimizer = torch.optim.AdamW(trainable, lr=args.lr)
    advantages_list = [1.0 if i % 2 == 0 else -1.0 for i in range(k)]
    advantages = torch.tensor(advantages_list, device=device)
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        num_return_sequences=k,
        pad_token_id=0,
        use_cache=True,
    )
    attention_mask = torch.ones_like(prompt)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    parts, losses, grad_norms = [], [], []

    def step():
        model.eval()
        start = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(input_ids=prompt, attention_mask=attention_mask, **kwargs)
        if tuple(output.shape) != (k, prompt_len + new_tokens):
            raise SystemExit(f"generate returned {tuple(output.shape)}, expected {k} x {prompt_len + new_tokens}")
        # An ordinary tensor: inference-mode tensors cannot enter autograd.
        sequences = output.clone()
        synchronize(device)
        generated = time.perf_counter() - start
        model.train()
        # Logits of the positions that predict the completion tokens only (what TRL computes).
        logits = model(input_ids=sequences, logits_to_keep=new_tokens + 1, use_cache=False).logits[:, :-1]
        targets = sequences[:, prompt_len:].unsqueeze(-1)
        logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets).squeeze(-1)
        loss = -(advantages * logprobs.sum(dim=1)).sum()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        grad_norms.append(grad_norm.item())
        synchronize(device)
        parts.append((generated, time.perf_counter() - start - generated))

    reset_peak(device)
    seconds, _ = timed(device, args.warmup, args.repeats, step)
    model.eval()
    if checkpointing:
        model.gradient_checkpointing_disable()
    timed_parts = parts[len(parts) - args.repeats :]
    generated_tokens = k * new_tokens
    trained_tokens = k * (prompt_len + new_tokens)
    tokens = generated_tokens + trained_tokens
    median = statistics.median(seconds)
    return {
        "samples": k,
        "prompt_tokens": prompt_len,
        "new_tokens_per_sequence": new_tokens,
        "generated_tokens": generated_tokens,
        "trained_tokens": trained_tokens,
        "tokens_per_step": tokens,
        "do_sample": True,
        "advantages": advantages_list,
        "loss": "-sum_i A_i * sum of completion-token log-probs",
        "trainable_parameters": sum(p.numel() for p in trainable),
        "gradient_checkpointing": checkpointing,
        "optimizer": f"AdamW(lr={args.lr}, weight_decay=0.01), grad-norm clip 1.0",
        "losses": losses,
        "grad_norms": grad_norms,
        "seconds": seconds,
        "seconds_median": median,
        "generate_seconds": [p[0] for p in timed_parts],
        "train_seconds": [p[1] for p in timed_parts],
        "generate_seconds_median": statistics.median(p[0] for p in timed_parts),
        "train_seconds_median": statistics.median(p[1] for p in timed_parts),
        "tokens_per_s": tokens / median,
        "max_memory_allocated_bytes": peak_bytes(device),
    }


def main(argv):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("model_reference: --device cuda but torch sees no CUDA device")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    dtype = torch.bfloat16 if use_cuda else torch.float32
    args.new_tokens = args.new_tokens or (128 if use_cuda else 16)
    args.train_len = args.train_len or (512 if use_cuda else 64)
    args.train_batch = args.train_batch or args.k
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"model_reference: unknown phases {sorted(unknown)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    start = time.perf_counter()
    base, source = load_model(args, device, dtype)
    base.eval()
    parameters = sum(p.numel() for p in base.parameters())
    log(f"{source}: {parameters / 1e6:.1f}M parameters on {device} ({dtype}) in {time.perf_counter() - start:.1f}s")
    checkpointing = args.gradient_checkpointing == "on" or (
        args.gradient_checkpointing == "auto" and parameters > 1_000_000_000
    )
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=0.0,
        target_modules=LORA_TARGETS,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    generator = model.get_base_model() if args.generate_without_lora else model
    prompt = torch.randint(
        1, model.config.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(args.seed)
    ).to(device)

    results = {}
    if "generate_batch1" in phases:
        log("generate at batch 1")
        results["generate_batch1"] = generate_phase(generator, device, args, prompt, 1, sample=False)
    if "generate_k" in phases:
        log(f"generate k={args.k} sampled")
        results["generate_k"] = generate_phase(generator, device, args, prompt, args.k, sample=True)
    if "lora_train_step" in phases:
        log(f"LoRA training step on {args.train_batch} x {args.train_len} tokens")
        results["lora_train_step"] = train_phase(model, device, args, checkpointing)
    if "rl_step" in phases:
        log(f"RL step: k={args.k} x {args.new_tokens} sampled tokens, then a policy-gradient step")
        results["rl_step"] = rl_phase(model, device, args, prompt, checkpointing)

    report = {
        "benchmark": "arc-rec model reference (transformers + peft)",
        "settings": {
            "model": source,
            "parameters": parameters,
            "layers": model.config.num_hidden_layers,
            "hidden_size": model.config.hidden_size,
            "vocab_size": model.config.vocab_size,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if use_cuda else platform.processor() or "cpu",
            "dtype": str(dtype).removeprefix("torch."),
            "cpu_threads": torch.get_num_threads(),
            "attn_implementation": model.config._attn_implementation,
            "prompt_tokens": args.prompt_len,
            "new_tokens": args.new_tokens,
            "k": args.k,
            "train_batch": args.train_batch,
            "train_tokens_per_sequence": args.train_len,
            "lora_r": args.lora_r,
            "lora_alpha": args.lora_alpha,
            "lora_targets": LORA_TARGETS,
            "generate_with_lora": not args.generate_without_lora,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "seed": args.seed,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
        **results,
        # The largest per-phase peak (None on the CPU, where torch tracks no allocator peak).
        "max_memory_allocated_bytes": (
            max(r["max_memory_allocated_bytes"] for r in results.values()) if use_cuda and results else None
        ),
        "wall_seconds": time.perf_counter() - start,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
