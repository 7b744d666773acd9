#!/usr/bin/env python3
"""Chat-template fidelity: `rl` renders and tokenizes chats exactly as transformers does.

Builds two byte-level BPE tokenizers locally with the `tokenizers` library (a Qwen-style and a
Llama-3-style pre-tokenizer regex, special tokens of each family), writes three model-directory
fixtures with the templates of `scripts/chat_templates/` (Qwen3 style as `chat_template.jinja`,
Qwen2.5 style as a `chat_template` string, Llama 3 style as named `default`/`tool_use`
templates), renders every case with transformers' `apply_chat_template` and writes the text and
token ids to `crates/rl-model/tests/fixtures/chat/cases.json`. Then it runs the Rust test that
renders and tokenizes the same cases with `rl-model` (the test CI runs on these fixtures) and
prints its per-case verdicts.

Needs transformers and tokenizers (PyPI); not part of `cargo xtask ci`. Usage:
    python3 scripts/check_chat_templates.py
"""
import json
import os
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = os.path.join(ROOT, "scripts", "chat_templates")
OUT = os.path.join(ROOT, "crates", "rl-model", "tests", "fixtures", "chat")

QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place — in °C or °F.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "threshold": {"type": "number", "default": 0.5, "multipleOf": 1e-05},
    }, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 10}},
    "required": ["query", "limit"]}, "description": "Searches the web.\nReturns <b>titles</b> & links."}}


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


TOOL_CHAT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Weather in Zürich and news about it?"},
    {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Zürich", "days": 2}),
                                                       call("search", {"query": "Zürich news", "limit": 3})]},
    {"role": "tool", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
    {"role": "tool", "content": "1. Lake festival\n2. Tram works"},
    {"role": "assistant", "content": "<think>\nBoth answers are in.\n</think>\n\nIt is 21.5 °C and clear."},
    {"role": "user", "content": "Thanks!  And tomorrow?"},
]
SIMPLE = [{"role": "user", "content": "Reverse the text: héllo wörld 🌍"}]
MULTI = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n4"},
    {"role": "user", "content": "  And 3+3?  "},
]

CASES = [
    ("qwen3", "no system prompt, generation prompt", SIMPLE, None, True, {}),
    ("qwen3", "tools, parallel tool calls, two tool results, reasoning after the last query", TOOL_CHAT, [WEATHER, SEARCH], True, {}),
    ("qwen3", "thinking off (enable_thinking=false)", MULTI, None, True, {"enable_thinking": False}),
    ("qwen3", "thinking on, earlier reasoning dropped", MULTI, None, True, {"enable_thinking": True}),
    ("qwen3", "no generation prompt", MULTI, None, False, {}),
    ("qwen25", "no system prompt (default one), multi-turn", MULTI, None, True, {}),
    ("qwen25", "tools and tool calls (dict literal through tojson)", TOOL_CHAT[:5], [WEATHER, SEARCH], True, {}),
    ("qwen25", "system prompt, no generation prompt", [{"role": "system", "content": "Be brief."}] + SIMPLE, None, False, {}),
    ("llama3", "system prompt, fixed date", [{"role": "system", "content": "  Answer in French.  "}] + SIMPLE, None, True,
     {"date_string": "26 Jul 2024"}),
    ("llama3", "tools (tool_use template, tojson indent=4), a call and its ipython result",
     [SIMPLE[0], {"role": "user", "content": "And the weather in Zürich?"},
      {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Zürich", "threshold": 0.25})]},
      {"role": "tool", "content": "{\"temp\": 21.5}"}], [WEATHER], True, {"date_string": "26 Jul 2024"}),
    ("llama3", "no system prompt, multi-turn", MULTI, None, False, {"date_string": "01 Jan 2025"}),
]


def corpus():
    texts = []
    for name in os.listdir(TEMPLATES):
        texts.append(open(os.path.join(TEMPLATES, name)).read())
    for _, _, messages, tools, _, _ in CASES:
        texts.append(json.dumps(messages, ensure_ascii=False))
        texts.append(json.dumps(tools or [], ensure_ascii=False, indent=4))
    return texts * 3


def build_tokenizer(split, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return tok


def write_dir(name, tok, config, jinja=None):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False, **config}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    if jinja is not None:
        with open(os.path.join(d, "chat_template.jinja"), "w") as f:
            f.write(jinja)
    return d


def main():
    read = lambda n: open(os.path.join(TEMPLATES, n)).read()
    qwen = build_tokenizer(QWEN_SPLIT, QWEN_SPECIALS)
    llama = build_tokenizer(LLAMA_SPLIT, LLAMA_SPECIALS)
    llama3 = read("llama3.jinja")
    no_tools = "{%- if tools %}{{ raise_exception('the default template takes no tools') }}{%- endif %}\n" + llama3
    write_dir("qwen3", qwen, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
              jinja=read("qwen3.jinja"))
    write_dir("qwen25", qwen, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                               "chat_template": read("qwen25.jinja")})
    write_dir("llama3", llama, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                "chat_template": [{"name": "default", "template": no_tools},
                                                  {"name": "tool_use", "template": llama3}]})
    cases = []
    for dir_name, what, messages, tools, gen, kwargs in CASES:
        tok = AutoTokenizer.from_pretrained(os.path.join(OUT, dir_name))
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False, **kwargs)
        ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=True, **kwargs)
        if hasattr(ids, "keys"):  # transformers >= 5 returns a BatchEncoding
            ids = ids["input_ids"]
        cases.append({"dir": dir_name, "case": what, "messages": messages, "tools": tools,
                      "add_generation_prompt": gen, "chat_template_kwargs": kwargs, "text": text, "ids": list(ids)})
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)
    print(f"transformers rendered {len(cases)} cases into {os.path.relpath(OUT, ROOT)}/cases.json")
    test = subprocess.run(["cargo", "test", "-q", "-p", "rl-model", "--test", "it", "chat_templates", "--",
                           "--nocapture"], cwd=ROOT)
    sys.exit(test.returncode)


if __name__ == "__main__":
    main()
