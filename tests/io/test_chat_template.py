"""Chat templates rendered by us and by transformers' apply_chat_template: same text, same ids."""

import dataclasses
import json

import msgspec
import pytest

from surogate.errors import FileFormatError, InvalidArgumentError
from surogate.io import ChatTemplate, Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Wetter für Städte — «aktuell»",  # non-ASCII must stay as is in tojson
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

CONVERSATIONS = {
    "single turn": [{"role": "user", "content": "Hi there"}],
    "system and multi turn": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "reasoning": [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nDone.", "reasoning_content": None},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "Sure.", "reasoning": "thinking under another name"},
    ],
    "tool call and result": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"temp": 21, "sky": "ensoleillé"}'},
    ],
}

VARIANTS = [
    dict(),
    dict(add_generation_prompt=True),
    dict(add_generation_prompt=True, enable_thinking=False),
    dict(tools=[WEATHER_TOOL]),
    dict(tools=[WEATHER_TOOL], add_generation_prompt=True, date_string="01 Jan 2025"),
]


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_templates_match_transformers(tokenizer_dir, hf_tokenizer, name):
    ours, hf = Tokenizer.from_folder(tokenizer_dir), hf_tokenizer(tokenizer_dir)
    messages = CONVERSATIONS[name]
    for kwargs in VARIANTS:
        want = hf.apply_chat_template(messages, tokenize=False, **kwargs)
        assert ours.apply_chat_template(messages, tokenize=False, **kwargs) == want, kwargs
        assert ours.apply_chat_template(messages, **kwargs) == hf.apply_chat_template(
            messages, return_dict=False, **kwargs), kwargs


def test_rendered_prompts_look_right(tokenizer_dir):
    tok = Tokenizer.from_folder(tokenizer_dir)
    messages = CONVERSATIONS["single turn"]
    text = tok.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False)
    assert "Städte — «aktuell»" in text  # tojson keeps non-ASCII
    if tok.bos_token:  # Llama 3: bos written by the template, tools indented by tojson(indent=4)
        assert text.startswith("<|begin_of_text|><|start_header_id|>system")
        assert '\n    "type": "function"' in text
        assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        ids = tok.apply_chat_template(messages)
        assert ids.count(tok.bos_token_id) == 1  # never a second bos from the post-processor
    else:
        assert text.endswith("<|im_start|>assistant\n")
        no_think = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
        assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_raise_exception_becomes_our_error(tmp_path):
    import jinja2
    from transformers import AutoTokenizer

    from sgtest.tiny_models import make_tokenizer

    path = make_tokenizer(tmp_path, "llama3")
    ours, hf = Tokenizer.from_folder(path), AutoTokenizer.from_pretrained(str(path))
    two_calls = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}]
    no_user = [{"role": "system", "content": "x"}]
    for messages, kwargs, reason in ((two_calls, {}, "only supports single tool-calls"),
                                     (no_user, {"tools": [WEATHER_TOOL]}, "no first user message")):
        with pytest.raises(jinja2.TemplateError, match=reason):
            hf.apply_chat_template(messages, **kwargs)
        with pytest.raises(InvalidArgumentError, match=reason) as e:
            ours.apply_chat_template(messages, **kwargs)
        assert "tokenizer_config.json" in str(e.value) and e.value.hint


def test_continue_final_message_matches_transformers(tokenizer_dir, hf_tokenizer):
    ours, hf = Tokenizer.from_folder(tokenizer_dir), hf_tokenizer(tokenizer_dir)
    messages = [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two,"}]
    want = hf.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert ours.apply_chat_template(messages, tokenize=False, continue_final_message=True) == want
    assert want.endswith("One, two,")
    with pytest.raises(InvalidArgumentError):
        ours.apply_chat_template(messages, continue_final_message=True, add_generation_prompt=True)


# -- the environment itself, on small templates, against transformers --

ENV_TEMPLATE = """
{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'skip' %}{% continue %}{% endif -%}
  {%- if m.role == 'stop' %}{% break %}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
  [{{ m.role }}]
  {%- if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}
{% endfor -%}
{{ dict(a=1, b=[1, 2]) | tojson }} {{ {'x': 'é'} | tojson(indent=2) }} {{ ns.n }} {{ bos_token }}|{{ extra }}
{%- if add_generation_prompt %}[assistant]{% endif %}"""


def test_environment_features_match_transformers(hf_tokenizer, tokenizer_dir):
    hf, ours = hf_tokenizer(tokenizer_dir), Tokenizer.from_folder(tokenizer_dir)
    messages = [{"role": "user", "content": "u1"}, {"role": "skip", "content": "s"},
                {"role": "assistant", "content": "a1"}, {"role": "stop", "content": "x"},
                {"role": "user", "content": "never"}]
    for kwargs in (dict(), dict(add_generation_prompt=True, extra="E")):
        want = hf.apply_chat_template(messages, chat_template=ENV_TEMPLATE, tokenize=False, **kwargs)
        assert ours.apply_chat_template(messages, chat_template=ENV_TEMPLATE, tokenize=False, **kwargs) == want


def test_generation_spans_mark_the_assistant_text():
    template = ChatTemplate(ENV_TEMPLATE)
    messages = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "first answer"},
                {"role": "user", "content": "u2"}, {"role": "assistant", "content": "second"}]
    text, spans = template.render_with_generation_spans(messages, bos_token="<s>", extra="")
    assert [text[a:b] for a, b in spans] == ["first answer", "second"]
    assert template.render(messages, bos_token="<s>", extra="") == text


def test_named_templates_pick_tool_use_when_tools_are_given(tmp_path):
    from sgtest.tiny_models import make_tokenizer

    path = make_tokenizer(tmp_path, "chatml")
    (path / "chat_template.jinja").write_text("D:{{ messages[0].content }}")
    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "tool_use.jinja").write_text("T:{{ tools | length }}")
    tok = Tokenizer.from_folder(path)
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages, tokenize=False) == "D:hi"
    assert tok.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=False) == "T:1"
    assert tok.apply_chat_template(messages, chat_template="tool_use", tools=[], tokenize=False) == "T:0"
    assert tok.apply_chat_template(messages, chat_template="X{{ 1 + 1 }}", tokenize=False) == "X2"


def test_sandbox_blocks_escapes():
    with pytest.raises(InvalidArgumentError, match="SecurityError"):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([{"role": "user", "content": ""}])
    with pytest.raises(InvalidArgumentError, match="underscore"):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([{"role": "user", "content": ""}])
    with pytest.raises(InvalidArgumentError, match="SecurityError"):  # the immutable sandbox: no in-place edits
        ChatTemplate("{{ messages.append(1) }}").render([{"role": "user", "content": ""}])


def test_syntax_error_names_the_source_and_line():
    with pytest.raises(FileFormatError, match=r"my_template.jinja: chat template syntax error at line 2") as e:
        ChatTemplate("ok\n{% if %}", origin="my_template.jinja")
    assert e.value.hint


def test_rich_message_objects_become_plain_data():
    @dataclasses.dataclass
    class Message:
        role: str
        content: str

    class Wire(msgspec.Struct):
        role: str
        content: str

    class Opaque:
        def dangerous(self):
            raise AssertionError("a template must not reach this")

    template = ChatTemplate("{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}{{ thing }}")
    text = template.render([Message("user", "a"), Wire("assistant", "b"), {"role": "user", "content": Opaque()}],
                           thing=Opaque())
    assert text == "user=a;assistant=b;user=<Opaque>;<Opaque>"


def test_empty_conversation_and_bad_tools():
    template = ChatTemplate("{{ messages }}")
    with pytest.raises(InvalidArgumentError, match="empty"):
        template.render([])
    with pytest.raises(InvalidArgumentError, match="JSON-schema"):
        template.render([{"role": "user", "content": "x"}], tools=[print])


def test_model_without_a_usable_template(tmp_path):
    from sgtest.tiny_models import make_tokenizer

    path = make_tokenizer(tmp_path, "chatml")
    data = json.loads((path / "tokenizer_config.json").read_text())
    del data["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(data))
    with pytest.raises(InvalidArgumentError, match="no chat template") as e:
        Tokenizer.from_folder(path).apply_chat_template([{"role": "user", "content": "x"}])
    assert "chat_template=" in e.value.hint
    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "a.jinja").write_text("A")
    (path / "additional_chat_templates" / "b.jinja").write_text("B")
    with pytest.raises(InvalidArgumentError, match=r"none is the default: \['a', 'b'\]"):
        Tokenizer.from_folder(path).apply_chat_template([{"role": "user", "content": "x"}])
