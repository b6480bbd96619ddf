"""Writes the reference fixtures the trainer's tokenizer and chat-template tests compare against.

Run with the project's virtualenv (tokenizers 0.23.3, transformers 5.23.0):

    source scripts/env.sh && python scripts/reference/make_text_fixtures.py

It builds two small byte-level BPE tokenizers in the exact tokenizer.json layouts of Qwen2.5 and
Llama 3 (same normalizer, pre-tokenizer regex, decoder and post-processor; a vocabulary trained on
a few lines of text instead of 150k tokens), encodes test strings with the Python library, and
renders Qwen2.5's chat template with transformers. The Rust tests must reproduce every id and
every character. Output is deterministic; rerunning it rewrites identical files.
"""

import json
import pathlib
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = pathlib.Path(__file__).resolve().parents[2] / "trainer" / "tests" / "fixtures"

# The pre-tokenizer split patterns, verbatim from the released tokenizer.json files.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TRAINING_TEXT = [
    "Switch to claude-3-haiku (98.7% lower cost, 96% reliability)",
    "Raise retry.max_attempts from 1 to 3: timeouts on web_search dropped by 40%.",
    'Current configuration: {"model": "gpt-4o-mini", "temperature": 0.7, "retry": {"max_attempts": 1}}',
    "12 of 40 runs failed (mean reliability 0.70, $0.0123/run).",
    "Top failures:\n- tool_error (timeout) x7: \"web_search timed out after 30s\"",
    "The recommender's answer isn't valid JSON; we'll retry.",
    "Lower temperature to 0.2 for deterministic tool calls.",
    "Ünïcödé tëxt, emoji 🚀 and CJK 推荐配置 are byte-level encoded.",
] * 4

TEST_STRINGS = [
    "Switch to claude-3-haiku (98.7% lower cost, 96% reliability)",
    'Current configuration: {"model": "gpt-4o-mini", "temperature": 0.7}',
    "  leading spaces,\ttabs\nand\r\nnew lines  ",
    "It's 2026; they'll ship 12345 configs.",
    "Ünïcödé 🚀 推荐 — unseen: ζ∑",
    "<|im_start|>user\nhello<|im_end|>\n",
    "",
]


def byte_level_bpe(pattern: str, specials: list[str], vocab_size: int, ignore_merges: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    return tokenizer


def qwen2_tokenizer() -> Tokenizer:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = byte_level_bpe(QWEN2_PATTERN, specials, 400, ignore_merges=False)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def llama3_tokenizer() -> Tokenizer:
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tokenizer = byte_level_bpe(LLAMA3_PATTERN, specials, 400, ignore_merges=True)
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, tokenizer.token_to_id(bos))],
            ),
        ]
    )
    return tokenizer


def write_one_case_per_line(path: pathlib.Path, cases: list) -> None:
    lines = ",\n".join(json.dumps(case, ensure_ascii=False) for case in cases)
    path.write_text(f"[\n{lines}\n]\n")


def write_tokenizer_fixture(name: str, tokenizer: Tokenizer) -> None:
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    cases = []
    for text in TEST_STRINGS:
        with_specials = tokenizer.encode(text, add_special_tokens=True).ids
        without = tokenizer.encode(text, add_special_tokens=False).ids
        cases.append(
            {
                "text": text,
                "ids_with_special_tokens": with_specials,
                "ids": without,
                "decoded_skipping_special_tokens": tokenizer.decode(with_specials, skip_special_tokens=True),
                "decoded": tokenizer.decode(with_specials, skip_special_tokens=False),
            }
        )
    write_one_case_per_line(folder / "expected.json", cases)


# Qwen2.5-Instruct's chat template as published in its tokenizer_config.json.
QWEN25_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are arc-rec. Answer with one JSON object."},
        {"role": "user", "content": "12 of 40 runs failed.\nRecommend one change."},
    ],
    "default_system": [
        {"role": "user", "content": "Hello"},
    ],
    "multi_turn": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": '{"type": "temperature", "diff": {"temperature": 0.2}}'},
        {"role": "user", "content": "  second, with spaces  "},
    ],
}


def write_chat_template_fixture() -> None:
    from transformers import AutoTokenizer

    folder = OUT / "qwen2_5_chat"
    folder.mkdir(parents=True, exist_ok=True)
    qwen = qwen2_tokenizer()
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "chat_template": QWEN25_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        qwen.save(str(pathlib.Path(tmp) / "tokenizer.json"))
        (pathlib.Path(tmp) / "tokenizer_config.json").write_text(json.dumps(config))
        hf = AutoTokenizer.from_pretrained(tmp)
        expected = {}
        for name, messages in CONVERSATIONS.items():
            expected[name] = {
                "messages": messages,
                "with_generation_prompt": hf.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
                ),
                "without_generation_prompt": hf.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=False
                ),
            }
    (folder / "expected.json").write_text(json.dumps(expected, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    write_tokenizer_fixture("qwen2_bpe", qwen2_tokenizer())
    write_tokenizer_fixture("llama3_bpe", llama3_tokenizer())
    write_chat_template_fixture()
    print(f"wrote fixtures under {OUT}")
