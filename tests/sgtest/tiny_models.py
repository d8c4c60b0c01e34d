"""Tiny Hugging Face model folders built offline, laid out like the real ones on the Hub.

``make_tokenizer`` writes a byte-level BPE tokenizer trained on a few sentences, in the style of
Llama 3 (post-processor adds ``<|begin_of_text|>``, header-id chat template with tools) or of
Qwen3 (ChatML, no BOS, ``<think>`` and tool-call tokens, ``enable_thinking``) or of Mistral v3
(``<s>``, ``[INST]`` turns, ``[TOOL_CALLS]``). The files are
written the way those repositories ship them: tokenizer.json, a tokenizer_config.json with
``added_tokens_decoder`` and an inline ``chat_template``, generation_config.json with several
eos ids. ``make_model(family, path)`` adds the family's tiny checkpoint (its ``Family.tiny``), a
randomly initialised transformers model (needs torch) saved with ``save_pretrained``, sharded when
``max_shard_size`` is given; ``make_llama`` / ``make_qwen3`` are it for those two.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = [
    "Hello world! This is a tiny tokenizer for tests.",
    "The quick brown fox jumps over the lazy dog, again and again.",
    "You are a helpful assistant. What is the weather like today?",
    "Let me think about it: 12 + 30 = 42, so the answer is 42.",
    "def add(a, b):\n    return a + b\n",
    "Ünïcödé text, emoji 🙂 and 中文字符 should round-trip.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
]

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Llama 3.2's template, shortened: system header with dates, custom tools in the first user turn.
LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Qwen3's template: ChatML, tools in the system turn, <think> blocks kept only after the last query.
CHATML_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
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
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

# Gemma 3's template, shortened: a system turn folds into the first user turn; the assistant is "model".
GEMMA_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set first_user_prefix = "" %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] %}
    {{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<start_of_turn>model\\n' }}
{%- endif %}
"""

# Mistral's v3 template (7B-Instruct-v0.3), shortened: [INST] turns, the tools in
# [AVAILABLE_TOOLS] before the last user turn, calls after [TOOL_CALLS], results in [TOOL_RESULTS].
MISTRAL_TEMPLATE = """{{- bos_token }}
{%- set user_messages = messages | selectattr("role", "equalto", "user") | list %}
{%- for message in messages %}
    {%- if message["role"] == "user" %}
        {%- if tools and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS][" }}
            {%- for tool in tools %}
                {{- tool | tojson }}
                {%- if not loop.last %}{{- ", " }}{%- endif %}
            {%- endfor %}
            {{- "][/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {{- "[INST]" + message["content"] + "[/INST]" }}
    {%- elif message["role"] == "assistant" and message.tool_calls is defined and message.tool_calls %}
        {{- "[TOOL_CALLS][" }}
        {%- for tool_call in message.tool_calls %}
            {%- set fn = tool_call.function if tool_call.function is defined else tool_call %}
            {{- '{"name": "' + fn.name + '", "arguments": ' }}
            {%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
            {{- "}" }}
            {%- if not loop.last %}{{- ", " }}{%- endif %}
        {%- endfor %}
        {{- "]" + eos_token }}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token }}
    {%- elif message["role"] == "tool" %}
        {{- '[TOOL_RESULTS]{"content": ' + message["content"] | tojson + "}[/TOOL_RESULTS]" }}
    {%- endif %}
{%- endfor %}
"""

STYLES = {
    "llama3": dict(
        pattern=LLAMA3_PATTERN,
        special=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                 "<|eot_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"],
        plain=[],
        config=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", tokenizer_class="PreTrainedTokenizerFast",
                    clean_up_tokenization_spaces=True, model_input_names=["input_ids", "attention_mask"]),
        eos=["<|end_of_text|>", "<|eot_id|>"],
        template=LLAMA3_TEMPLATE,
        bos="<|begin_of_text|>",
    ),
    "chatml": dict(
        pattern=QWEN_PATTERN,
        special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        # Qwen3 adds these as ordinary (non-special) tokens: decode(skip_special_tokens=True) keeps them.
        plain=["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"],
        config=dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
                    tokenizer_class="Qwen2Tokenizer", clean_up_tokenization_spaces=False, errors="replace",
                    split_special_tokens=False),
        eos=["<|im_end|>", "<|endoftext|>"],
        template=CHATML_TEMPLATE,
    ),
    "gemma": dict(
        pattern=QWEN_PATTERN,
        special=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        plain=[],
        config=dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
                    tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False),
        eos=["<eos>", "<end_of_turn>"],
        template=GEMMA_TEMPLATE,
        bos="<bos>",  # the tokenizer adds it, as Gemma's does
    ),
    "mistral": dict(
        pattern=LLAMA3_PATTERN,
        special=["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                 "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]", "[CALL_ID]"],
        plain=[],
        config=dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", tokenizer_class="LlamaTokenizerFast",
                    clean_up_tokenization_spaces=False, legacy=False),
        eos=["</s>"],
        template=MISTRAL_TEMPLATE,
        bos="<s>",
    ),
}


def build_tokenizer(style: str = "llama3") -> Tokenizer:
    """The `tokenizers` object alone: byte-level BPE with the style's split regex and added tokens."""
    s = STYLES[style]
    tok = Tokenizer(models.BPE())
    if style == "chatml":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(s["pattern"]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if style in ("llama3", "mistral"):
        tok.model.ignore_merges = True  # as in Llama 3's tokenizer.json (and what llama.cpp's llama-bpe assumes)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in s["special"]])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in s["plain"]])
    if s.get("bos"):
        bos = s["bos"]
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                          special_tokens=[(bos, tok.token_to_id(bos))]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def make_tokenizer(path: str | Path, style: str = "llama3") -> Path:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json into ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    s = STYLES[style]
    tok = build_tokenizer(style)
    tok.save(str(path / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": t in s["special"]}
        for t in s["special"] + s["plain"]
    }
    config = {"added_tokens_decoder": added, **s["config"], "chat_template": s["template"],
              "model_max_length": 131072}
    _write_json(path / "tokenizer_config.json", config)
    generation = {"eos_token_id": [tok.token_to_id(t) for t in s["eos"]]}
    if s.get("bos"):
        generation["bos_token_id"] = tok.token_to_id(s["bos"])
    gen_path = path / "generation_config.json"
    if gen_path.exists():  # keep what save_pretrained wrote, with our eos ids
        generation = {**json.loads(gen_path.read_text()), **generation}
    _write_json(gen_path, generation)
    return path


def make_model(family: str, path: str | Path, *, max_shard_size: int | str | None = None, dtype: str = "float32",
               seed: int = 0, **overrides) -> Path:
    """The family's tiny checkpoint (``Family.tiny``, in its file: sizes, tokenizer style, special
    tokens), randomly initialised by transformers, with ``overrides`` of its config keys."""
    import transformers

    from surogate.models import family_named

    f = family_named(family)
    tok = build_tokenizer(f.tiny.tokenizer)
    m = f.tiny.vocab_multiple
    special = {"eos_token_id": tok.token_to_id(f.tiny.eos_token)}
    if f.tiny.bos_token is not None:
        special = {"bos_token_id": tok.token_to_id(f.tiny.bos_token), **special}
    model_class = getattr(transformers, f.hf_architecture)
    config = model_class.config_class(**{"vocab_size": -(-tok.get_vocab_size() // m) * m, **f.tiny.config,
                                         **special, **overrides})
    return _save_model(path, model_class, config, f.tiny.tokenizer, max_shard_size, dtype, seed)


def make_llama(path: str | Path, **kw) -> Path:
    """A 2-layer Llama with grouped-query attention and a Llama-3-style tokenizer."""
    return make_model("llama", path, **kw)


def make_qwen3(path: str | Path, **kw) -> Path:
    """A 2-layer Qwen3 (q/k norms, tied embeddings, vocab padded past the tokenizer) with a ChatML tokenizer."""
    return make_model("qwen3", path, **kw)


def _save_model(path, model_class, config, style, max_shard_size, dtype, seed) -> Path:
    import torch
    from transformers.utils import logging

    logging.disable_progress_bar()
    path = Path(path)
    torch.manual_seed(seed)
    model = model_class(config).to(getattr(torch, dtype))
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, **kwargs)
    return make_tokenizer(path, style)


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def make_embedding_gemma(path: str | Path, *, seed: int = 0, dense: tuple[int, ...] = (96,), **overrides) -> Path:
    """A tiny EmbeddingGemma as sentence-transformers lays it out: a Gemma3TextModel with
    bidirectional attention (its tensors without the "model." prefix), then modules.json's mean
    Pooling, Dense projections hidden -> dense... -> hidden (no bias, identity; random), Normalize."""
    import numpy as np
    import transformers

    from surogate.io import save_safetensors
    from surogate.models import family_named

    f = family_named("gemma3")
    tok = build_tokenizer(f.tiny.tokenizer)
    config = transformers.Gemma3TextConfig(**{
        "vocab_size": tok.get_vocab_size(), **f.tiny.config, "use_bidirectional_attention": True,
        "bos_token_id": tok.token_to_id(f.tiny.bos_token), "eos_token_id": tok.token_to_id(f.tiny.eos_token),
        **overrides})
    path = _save_model(path, transformers.Gemma3TextModel, config, f.tiny.tokenizer, None, "float32", seed)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    hidden = config.hidden_size
    (path / "1_Pooling").mkdir()
    _write_json(path / "1_Pooling" / "config.json", {
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": True})
    rng = np.random.default_rng(seed)
    widths = [hidden, *dense, hidden]
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        name = f"{i + 2}_Dense"
        (path / name).mkdir()
        _write_json(path / name / "config.json", {"in_features": n_in, "out_features": n_out, "bias": False,
                                                  "activation_function": "torch.nn.modules.linear.Identity"})
        w = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        save_safetensors(path / name / "model.safetensors", {"linear.weight": w})
        modules.append({"idx": i + 2, "name": str(i + 2), "path": name, "type": "sentence_transformers.models.Dense"})
    n = len(modules)
    modules.append({"idx": n, "name": str(n), "path": f"{n}_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
    (path / f"{n}_Normalize").mkdir()
    _write_json(path / "modules.json", modules)
    return path


def make_gemma3_vision(path: str | Path, *, seed: int = 0, text: dict | None = None, **overrides) -> Path:
    """A tiny Gemma3ForConditionalGeneration: the gemma3 family's tiny text config as text_config
    (with ``text`` overrides), its TINY_VISION tower and projector (with ``overrides`` of the outer
    Gemma3Config keys), the Gemma tokenizer's vocabulary plus three ids past it for
    <start_of_image>, <end_of_image> and the image token (tests feed token ids). transformers
    initialises the projection weight and every (1 + w) norm to zeros, the layer norms to ones and
    the biases to zeros: each such constant tensor gets seeded noise (0.1) added, so that none of
    them can be dropped or misread unseen."""
    import torch
    import transformers
    from transformers.utils import logging

    from surogate.models import family_named
    from surogate.models.gemma3 import TINY_VISION

    f = family_named("gemma3")
    tok = build_tokenizer(f.tiny.tokenizer)
    v = tok.get_vocab_size()
    special = {"bos_token_id": tok.token_to_id(f.tiny.bos_token), "eos_token_id": tok.token_to_id(f.tiny.eos_token)}
    text_config = {**f.tiny.config, "vocab_size": v + 3, **special, **(text or {})}
    config = transformers.Gemma3Config(**{
        **TINY_VISION, "text_config": text_config, "boi_token_index": v, "eoi_token_index": v + 1,
        "image_token_index": v + 2, **overrides})
    logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if bool((p == p.flatten()[0]).all()):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    path = Path(path)
    model.save_pretrained(path)
    # preprocessor_config.json as the hub's Gemma 3 folders have it (resize to image_size, mean / std 0.5)
    size = config.vision_config.image_size
    _write_json(path / "preprocessor_config.json", {
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "do_pan_and_scan": None, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": config.mm_tokens_per_image, "resample": 2, "rescale_factor": 1 / 255,
        "size": {"height": size, "width": size}})
    return make_tokenizer(path, f.tiny.tokenizer)


QWEN3_VL_IMAGE, QWEN3_VL_VIDEO, QWEN3_VL_START, QWEN3_VL_END = 90, 91, 92, 93  # the qwen3_vl TINY's ids


def make_qwen3_vl(path: str | Path, *, tie: bool = False, seed: int = 0, config: dict | None = None,
                  moe: bool = False) -> Path:
    """A tiny Qwen3VLForConditionalGeneration (surogate/models/qwen3_vl.py TINY: text 2 layers,
    hidden 64, heads 4 / 2 of 16, mrope_section [2, 3, 3]; a 3-block tower of width 32, 8-pixel
    patches, DeepStack after blocks 0 and 2), weights only (tests feed token ids). Every weight is
    random (HF's init leaves biases 0 and norms 1): norms 1 + N(0, 0.2²), the rest N(0, 0.15²).
    ``config``: keys over TINY's (text_config's merged into TINY's). ``moe``: a
    Qwen3VLMoeForConditionalGeneration of qwen3_vl_moe.py's TINY instead (3 text layers, the middle
    one dense, 6 experts, top 2), saved by transformers (its stacked experts [E, out, in])."""
    import torch
    import transformers
    from transformers.utils import logging

    if moe:
        from surogate.models.qwen3_vl_moe import TINY
    else:
        from surogate.models.qwen3_vl import TINY

    logging.disable_progress_bar()
    torch.manual_seed(seed)
    cfg = {**TINY, **(config or {})}
    cfg["text_config"] = {**TINY["text_config"], **((config or {}).get("text_config") or {})}
    classes = ((transformers.Qwen3VLMoeForConditionalGeneration, transformers.Qwen3VLMoeConfig) if moe else
               (transformers.Qwen3VLForConditionalGeneration, transformers.Qwen3VLConfig))
    model = classes[0](classes[1](**cfg, tie_word_embeddings=tie)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.save_pretrained(path)
    return Path(path)


def qwen3_vl_prompts(seed: int = 1):
    """Prompts for make_qwen3_vl: (ids with two images of grids 4 x 6 and 6 x 4, (pixel rows,
    image_grid_thw)) and (ids with a 3-frame 4 x 4 video, a timestamp's two text tokens before each
    frame, (pixel rows, video_grid_thw)); random pixel rows."""
    import numpy as np

    def span(h, w, token):
        return [QWEN3_VL_START] + [token] * (h * w // 4) + [QWEN3_VL_END]

    def rows(grids, s):
        n = sum(int(np.prod(g)) for g in grids)
        return np.random.default_rng(s).standard_normal((n, 3 * 2 * 8 * 8)).astype(np.float32)

    grids = [[1, 4, 6], [1, 6, 4]]
    img = [5, 6, 7] + span(4, 6, QWEN3_VL_IMAGE) + [8, 9] + span(6, 4, QWEN3_VL_IMAGE) + [10, 11, 12]
    vid = [5, 6]
    for f in range(3):
        vid += [20 + f, 30] + span(4, 4, QWEN3_VL_VIDEO)
    vid += [7, 8]
    return (img, (rows(grids, seed), np.array(grids))), (vid, (rows([[3, 4, 4]], seed + 1), np.array([[3, 4, 4]])))
