"""The serving frontend on the tiny tokenizers of tests/sgtest: incremental detokenization of
unicode and emoji, stop strings split across tokens never leaking, the output pipeline, and
chat-template rendering with tools and thinking controls."""

from __future__ import annotations

import random

import pytest
from sgtest import tiny_models

from surogate.io import Tokenizer
from surogate.serve.detokenizer import IncrementalDetokenizer
from surogate.serve.frontend import (
    Limits,
    OutputProcessor,
    RequestError,
    check_sampling,
    decode_logprobs,
    encode_prompt,
    fit_to_context,
    render_chat,
    template_kwargs,
    token_text,
)
from surogate.serve.parsers import ParserChoice, make_output_parser
from surogate.serve.stop import StopMatcher
from surogate.serve.types import SamplingParams
from surogate.serve.types import TokenLogprob

SEED = 7
TEXTS = [
    *tiny_models.CORPUS,
    "Emoji 🙂🙃 family 👨‍👩‍👧 flags 🇫🇷 and skin tones 👍🏽 in one line.",
    "中文字符 should round-trip, 日本語も、한국어도.",
    "Ünïcödé: ĳ ǅ ﬁ — “quotes” … and a tab\tand\nnewlines\n\n",
    "math: ∑ x² ≤ ∞, arrows → ⇒, and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 outside the BMP",
]


@pytest.fixture(scope="module", params=["chatml", "llama3"])
def tok(request, tmp_path_factory):
    return Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path_factory.mktemp(request.param), request.param))


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    return Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path_factory.mktemp("chatml_fe"), "chatml"))


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    return Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path_factory.mktemp("llama3_fe"), "llama3"))


# -- detokenizer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_detokenizer_equals_decode_and_never_emits_half_characters(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    # The test is only meaningful if some tokens hold part of a character.
    if any(ord(c) > 0x7F for c in text):
        assert any("\ufffd" in tok.decode([i]) for i in ids)
    rng = random.Random(SEED)
    for batch in (1, 2, 3, None):  # one token per step, a few, random sizes
        detok = IncrementalDetokenizer(tok)
        deltas, i = [], 0
        while i < len(ids):
            k = batch or rng.randint(1, 5)
            deltas.append(detok.push(ids[i:i + k]))
            i += k
        deltas.append(detok.flush())
        assert "".join(deltas) == tok.decode(ids) == detok.text
        if "\ufffd" not in text:
            assert not any("\ufffd" in d for d in deltas)


def test_detokenizer_skips_special_tokens(llama3):
    ids = [llama3.bos_token_id, *llama3.encode("Hello world!", add_special_tokens=False), llama3.eos_token_id]
    for skip in (True, False):
        detok = IncrementalDetokenizer(llama3, skip_special_tokens=skip)
        text = "".join(detok.push([i]) for i in ids) + detok.flush()
        assert text == llama3.decode(ids, skip_special_tokens=skip)


def test_token_bytes_of_partial_characters_join_into_the_text(chatml):
    text = "🙂 中文"
    ids = chatml.encode(text, add_special_tokens=False)
    assert bytes(b for i in ids for b in token_text(chatml, i)[1]) == text.encode()


# -- stop strings ---------------------------------------------------------------------------------


def run(tok, ids, opts, parser=None, finish="length", batch=1):
    """Feed ``ids`` as an engine would (``batch`` per step, the last step finishing); returns the
    processor and everything it emitted at each step."""
    proc = OutputProcessor(tok, opts, parser)
    steps = []
    for i in range(0, len(ids), batch):
        last = i + batch >= len(ids)
        steps.append(proc.step(ids[i:i + batch], finish_reason=finish if last else None))
        if proc.finished:
            break
    return proc, steps


def boundary_stops(tok, text, rng, count=8):
    """Stop strings that start in one token and end in a later one."""
    ids = tok.encode(text, add_special_tokens=False)
    ends = []
    for k in range(1, len(ids) + 1):
        ends.append(len(tok.decode(ids[:k])))
    stops = set()
    for _ in range(200):
        cut = rng.choice(ends[:-1])
        a, b = cut - rng.randint(1, 3), cut + rng.randint(1, 4)
        if a >= 0 and b <= len(text) and text[a:b].strip() and "\ufffd" not in text[a:b]:
            stops.add(text[a:b])
        if len(stops) >= count:
            break
    return sorted(stops)


@pytest.mark.parametrize("text", TEXTS[:7] + TEXTS[-3:-1])
def test_stop_strings_split_across_tokens_never_leak(tok, text):
    rng = random.Random(SEED)
    ids = tok.encode(text, add_special_tokens=False)
    full = tok.decode(ids)
    for stop in boundary_stops(tok, full, rng):
        at = full.find(stop)
        for include in (False, True):
            for batch in (1, 2):
                proc, steps = run(tok, ids, SamplingParams(stop=[stop], include_stop_str_in_output=include),
                                  batch=batch)
                emitted, seen = "", ""
                for d in steps:
                    emitted += d.content
                    seen = emitted
                    if not include:
                        # Never, at any step, a character of the stop string.
                        assert len(seen) <= at, (stop, seen)
                assert emitted == (full[:at + len(stop)] if include else full[:at])
                assert proc.finish_reason == "stop" and proc.stop_reason == stop
                assert proc.stopped_by_string


def test_earliest_stop_string_wins_and_held_text_is_released():
    m = StopMatcher(["world", "lo w"])
    assert m.push("Hel") == "He"  # "l" could begin "lo w"
    assert m.push("lo") == "l"
    assert m.push(" wor") == ""
    assert m.matched == "lo w"
    m = StopMatcher(["STOP"])
    assert [m.push(x) for x in ("a S", "T", "x")] == ["a ", "", "STx"]
    assert m.flush() == "" and m.matched is None
    m = StopMatcher(["STOP"])
    assert m.push("ST") == "" and m.flush() == "ST"  # ended without a match: the held tail is text


def test_eos_and_stop_token_ids(chatml):
    ids = chatml.encode("Hello world!", add_special_tokens=False)
    eos = chatml.eos_token_id
    opts = SamplingParams(skip_special_tokens=False)
    proc, steps = run(chatml, [*ids, eos], opts, finish="stop")
    assert "".join(d.content for d in steps) == "Hello world!"  # the EOS text is not part of the answer
    assert proc.stop_reason is None and proc.num_tokens == len(ids) + 1
    stop_id = ids[-1]
    proc, steps = run(chatml, ids, SamplingParams(stop_token_ids=[stop_id]), finish="stop")
    assert proc.stop_reason == stop_id
    assert "".join(d.content for d in steps) == chatml.decode(ids[:-1])
    proc, steps = run(chatml, ids, SamplingParams(stop_token_ids=[stop_id], include_stop_str_in_output=True),
                      finish="stop")
    assert "".join(d.content for d in steps) == "Hello world!"


def test_output_processor_with_parsers_and_logprobs(chatml):
    text = ('<think>\nThe user wants weather 🙂.\n</think>\n\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    ids = [*chatml.encode(text, add_special_tokens=False), chatml.eos_token_id]
    parser = make_output_parser(ParserChoice("qwen3", "hermes"), None, tools=True)
    proc = OutputProcessor(chatml, SamplingParams(logprobs=2), parser)
    out = []
    for i, t in enumerate(ids):
        lp = TokenLogprob(t, -0.5, 1, [TokenLogprob(t, -0.5, 1), TokenLogprob(0, -2.0, 2)])
        out.append(proc.step([t], [lp], "stop" if i == len(ids) - 1 else None))
    assert "".join(d.reasoning for d in out) == "The user wants weather 🙂."
    assert "".join(d.content for d in out) == "Checking."
    assert [c.name for d in out for c in d.tool_calls if c.name] == ["get_weather"]
    assert "".join(c.arguments for d in out for c in d.tool_calls) == '{"city": "Paris"}'
    assert out[-1].finish_reason == "tool_calls"
    assert proc.num_tokens == len(ids) and 0 < proc.reasoning_tokens < len(ids)
    entries = [e for d in out for e in d.logprobs]
    assert len(entries) == len(ids) and entries[0].top[1].token_id == 0
    assert all(e.logprob == -0.5 for e in entries)
    # After the end nothing more comes out (outputs in flight after a stop string).
    assert proc.step([ids[0]]).content == ""


@pytest.mark.parametrize("skip", [True, False])
def test_a_parsers_special_tags_stay_in_the_text_while_other_specials_are_skipped(tmp_path, skip):
    """Mistral's v11 calls are special tokens ([TOOL_CALLS], [ARGS]): with the default
    skip_special_tokens the parser still sees them (vLLM's tool parsers keep them too), while the
    other special tokens (here [INST]) stay out of the content."""
    mistral = Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path, "mistral"))
    text = 'Sure [INST].[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    ids = [*mistral.encode(text, add_special_tokens=False), mistral.eos_token_id]
    assert {mistral.token_to_id("[TOOL_CALLS]"), mistral.token_to_id("[INST]")} <= set(ids)
    parser = make_output_parser(ParserChoice(None, "mistral"), None, tools=True)
    _, steps = run(mistral, ids, SamplingParams(skip_special_tokens=skip), parser, finish="stop")
    assert "".join(d.content for d in steps) == ("Sure ." if skip else "Sure [INST].")
    assert "".join(c.arguments for d in steps for c in d.tool_calls) == '{"city": "Paris"}'
    assert [c.name for d in steps for c in d.tool_calls if c.name] == ["get_weather"]
    # without a parser the default still skips every special token
    _, plain = run(mistral, ids, SamplingParams(), None, finish="stop")
    assert "".join(d.content for d in plain) == 'Sure .get_weather{"city": "Paris"}'


def test_a_stop_string_inside_a_multi_token_output_ends_the_answer_at_its_token(chatml):
    """A speculative step hands several accepted tokens at once: a stop string completed by one of
    them ends the answer there, as plain decoding would (the later tokens are neither returned nor
    counted), and the text equals the one-token-at-a-time run's."""
    text = "alpha beta STOP gamma delta epsilon"
    ids = chatml.encode(text, add_special_tokens=False)
    opts = SamplingParams(stop=["STOP"], logprobs=0)
    plain, one = run(chatml, ids, opts, batch=1)
    spec, many = run(chatml, ids, opts, batch=len(ids))
    assert "".join(d.content for d in many) == "".join(d.content for d in one) == "alpha beta "
    assert spec.num_tokens == plain.num_tokens < len(ids)
    assert [t for d in many for t in d.new_token_ids] == [t for d in one for t in d.new_token_ids]
    at_once = OutputProcessor(chatml, opts).step(ids, [TokenLogprob(t, -0.5, 1) for t in ids], "length")
    assert len(at_once.logprobs) == len(at_once.new_token_ids) == at_once.num_output_tokens == plain.num_tokens
    assert many[-1].finish_reason == "stop" and many[-1].stop_reason == "STOP"


def test_prompt_logprobs_entries(chatml):
    ids = chatml.encode("Hello world", add_special_tokens=False)
    entries = decode_logprobs(chatml, [None, *[TokenLogprob(i, -1.0, 1) for i in ids[1:]]])
    assert entries[0] is None and [e.token for e in entries[1:]] == [chatml.decode([i]) for i in ids[1:]]


# -- requests -------------------------------------------------------------------------------------

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}}}}}


def test_render_chat_passes_tools_and_thinking_controls(chatml):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    prompt = render_chat(chatml, messages, [WEATHER_TOOL])
    assert '"name": "get_weather"' in prompt.text and "<tools>" in prompt.text
    assert prompt.token_ids == chatml.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True)
    off = render_chat(chatml, messages, kwargs=template_kwargs(enable_thinking=False))
    assert off.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = render_chat(chatml, messages, kwargs=template_kwargs(enable_thinking=True))
    assert on.text.endswith("<|im_start|>assistant\n")


def test_tool_call_arguments_reach_the_template_as_objects(chatml, llama3):
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = render_chat(chatml, history).text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    text = render_chat(llama3, history, [WEATHER_TOOL]).text
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}' in text  # not a doubly encoded string


def test_template_kwargs_precedence():
    assert template_kwargs() == {}
    assert template_kwargs(reasoning_effort="none") == {"reasoning_effort": "none", "enable_thinking": False,
                                                        "thinking": False}
    assert template_kwargs({"enable_thinking": False}, enable_thinking=True)["enable_thinking"] is True
    assert template_kwargs(enable_thinking=True, chat_template_kwargs={"enable_thinking": False})[
        "enable_thinking"] is False


def test_template_errors_name_messages(llama3):
    two_calls = [{"role": "user", "content": "x"},
                 {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": {}}}] * 2}]
    with pytest.raises(RequestError, match="single tool-calls") as e:
        render_chat(llama3, two_calls)
    assert e.value.param == "messages"


def test_sampling_checks_and_context_fit():
    limits = Limits(max_model_len=100, max_logprobs=5)
    check_sampling(SamplingParams(), limits)
    with pytest.raises(RequestError) as e:
        check_sampling(SamplingParams(logprobs=9), limits, {"logprobs": "top_logprobs"})
    assert e.value.param == "top_logprobs"
    with pytest.raises(RequestError) as e:
        check_sampling(SamplingParams(top_p=0), limits)
    assert e.value.param == "top_p"
    assert fit_to_context(SamplingParams(), 30, limits, prompt_param="messages",
                          max_tokens_param="max_tokens").max_tokens == 70
    with pytest.raises(RequestError) as e:
        fit_to_context(SamplingParams(max_tokens=71), 30, limits, prompt_param="messages",
                       max_tokens_param="max_completion_tokens")
    assert (e.value.param, e.value.code) == ("max_completion_tokens", "context_length_exceeded")
    with pytest.raises(RequestError) as e:
        fit_to_context(SamplingParams(), 100, limits, prompt_param="prompt", max_tokens_param="max_tokens")
    assert e.value.param == "prompt"


def test_encode_prompt(llama3):
    assert encode_prompt(llama3, "Hello").token_ids == llama3.encode("Hello")
    assert encode_prompt(llama3, [1, 2, 3]).token_ids == [1, 2, 3]
    with pytest.raises(RequestError, match="outside the vocabulary") as e:
        encode_prompt(llama3, [1, 10**6], param="prompt[1]")
    assert e.value.param == "prompt[1]"
