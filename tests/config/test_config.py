"""load_config: defaults, the example configs, and an error for every kind of mistake that names
the key path (and its line), says what is allowed, and comes before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from surogate.config import CONFIG_KINDS, PTConfig, SFTConfig, load_config
from surogate.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MINIMAL = {"model": "some/model", "datasets": [{"path": "data.jsonl"}]}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def error_of(source, kind: str = "sft") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(source, kind=kind)
    return info.value


# -- good configs --

@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_loads(path: Path) -> None:
    kind = path.name.split("-")[0]  # sft-*.yaml, pt-*.yaml, dpo-*.yaml, distill-*.yaml, grpo-*.yaml
    config = load_config(path, kind=kind)
    assert isinstance(config, CONFIG_KINDS[kind]) and config.kind == kind
    assert config.datasets and config.metrics_path


def test_examples_exist() -> None:
    names = {p.name for p in CONFIGS.glob("*.yaml")}
    assert {"sft-lora-qwen3.yaml", "sft-lora-tiny.yaml", "pt-tiny.yaml", "dpo-lora-tiny.yaml",
            "distill-lora-tiny.yaml", "grpo-lora-smollm2-arithmetic.yaml"} <= names


def test_defaults() -> None:
    c = load_config(MINIMAL)
    assert (c.output_dir, c.sequence_len, c.sample_packing) == ("output", 1024, True)
    assert (c.per_device_train_batch_size, c.gradient_accumulation_steps, c.num_epochs, c.max_steps) == (2, 4, 3, -1)
    assert (c.learning_rate, c.lr_scheduler_type, c.weight_decay, c.max_grad_norm) == (2e-4, "linear", 0.0, 1.0)
    assert (c.optimizer, c.adamw_beta1, c.adamw_beta2, c.adamw_epsilon) == ("adamw", 0.9, 0.999, 1e-8)
    assert (c.lora, c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_target_modules) == (True, 16, 32, 0.0, ["all"])
    assert len(c.lora_targets) == 7
    assert (c.recipe, c.dtype, c.recompute, c.device) == ("bf16", "bfloat16", False, "auto")
    assert (c.save_steps, c.save_total_limit, c.resume_from_checkpoint) == (50, 5, False)
    assert (c.eval_steps, c.logging_steps, c.report_to, c.seed) == (100, 1, ["jsonl"], 1234)
    assert (c.gpus, c.zero_level) == (1, 1)  # the original Surogate's: one GPU, ZeRO-1 once there are more
    assert c.metrics_path == str(Path("output") / "metrics.jsonl")
    assert (c.train_on, c.skip_bad_rows, c.merge_adapter) == ("assistant", False, False)
    assert c.eval_split_ratio == 0.1
    d = c.datasets[0]
    assert (d.type, d.split, d.subset, d.samples, d.train_on) == ("auto", "train", None, None, None)
    fields = (d.messages_field, d.text_field, d.instruction_field, d.output_field)
    assert fields == (None, "text", "instruction", "output")


def test_yaml_file_with_floats_written_without_a_dot(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, "model: m\nlearning_rate: 2e-4\nadamw_epsilon: 1E-6\n"
                                    "datasets:\n  - path: d.jsonl\n    type: messages\n"))
    assert c.learning_rate == 2e-4 and c.adamw_epsilon == 1e-6
    assert c.datasets[0].type == "messages"


def test_pt_trains_on_everything() -> None:
    c = load_config(MINIMAL, kind="pt")
    assert c.kind == "pt" and c.train_on == "all"
    e = error_of({**MINIMAL, "train_on": "assistant"}, kind="pt")
    assert "train_on" in e.message and "all" in e.hint


def test_fp32_recipe_and_derived_values() -> None:
    c = load_config({**MINIMAL, "recipe": "fp32", "output_dir": "out", "validation_datasets": [{"path": "v.jsonl"}],
                     "resume_from_checkpoint": "out/step_00000010"})
    assert c.dtype == "float32" and c.metrics_path == str(Path("out") / "metrics.jsonl")
    assert c.eval_split_ratio == 0.0  # validation_datasets take the place of a split
    assert c.resume_from_checkpoint == "out/step_00000010"
    assert load_config({**MINIMAL, "eval_steps": 0}).eval_split_ratio == 0.0


# -- errors --

def test_unknown_key_suggests_close_matches_and_lists_allowed_keys(tmp_path: Path) -> None:
    e = error_of(write(tmp_path, "model: m\nlearnig_rate: 1.0e-4\ndatasets: [{path: d.jsonl}]\n"))
    assert "'learnig_rate'" in e.message
    assert e.where.endswith("run.yaml line 2")
    assert "did you mean 'learning_rate'" in e.hint and "sequence_len" in e.hint


def test_unknown_nested_key_names_its_path(tmp_path: Path) -> None:
    e = error_of(write(tmp_path, "model: m\ndatasets:\n  - path: a.jsonl\n  - path: b.jsonl\n    tyep: text\n"))
    assert "'datasets[1].tyep'" in e.message and e.where.endswith("line 5")
    assert "did you mean 'type'" in e.hint and "messages_field" in e.hint


def test_renamed_key_from_the_original_surogate() -> None:
    e = error_of({**MINIMAL, "loss_scale": "all"})
    assert "loss_scale" in e.message and "'train_on'" in e.hint


@pytest.mark.parametrize("override, key, allowed", [
    ({"datasets": [{"path": "d", "type": "chat"}]}, "datasets[0].type",
     "auto, instruction, messages, preference, prompt, text"),
    ({"lr_scheduler_type": "step"}, "lr_scheduler_type", "constant, cosine, linear, wsd"),
    ({"optimizer": "sgd"}, "optimizer", "adamw, adamw_8bit"),
    ({"train_on": "assistants"}, "train_on", "all, assistant, last_turn"),
    ({"device": "tpu"}, "device", "auto, cpu, cuda"),
    ({"report_to": ["jsonl", "aim"]}, "report_to[1]", "jsonl, wandb"),
    ({"lora_target_modules": ["q_proj", "qkv_proj"]}, "lora_target_modules[1]", "q_proj"),
    ({"recipe": "fp16"}, "recipe", "bf16, fp32"),
    ({"datasets": [{"path": "d", "train_on": "user"}]}, "datasets[0].train_on", "assistant"),
])
def test_bad_enum_value_names_the_key_and_the_allowed_values(override, key, allowed) -> None:
    e = error_of({**MINIMAL, **override})
    assert e.message.startswith(f"{key}:"), e.message
    assert "not an allowed value" in e.message
    assert allowed in e.hint


@pytest.mark.parametrize("override, key, expected", [
    ({"sequence_len": "long"}, "sequence_len", "an integer"),
    ({"sequence_len": 10.5}, "sequence_len", "an integer"),
    ({"learning_rate": "fast"}, "learning_rate", "a number"),
    ({"sample_packing": "yes please"}, "sample_packing", "true or false"),
    ({"lora_target_modules": "q_proj"}, "lora_target_modules", "a list"),
    ({"datasets": "data.jsonl"}, "datasets", "a list of mappings"),
    ({"datasets": [{"path": "d", "samples": "ten"}]}, "datasets[0].samples", "an integer"),
    ({"resume_from_checkpoint": 3}, "resume_from_checkpoint", "true or false or a string"),
])
def test_bad_type_names_the_key_and_the_expected_type(override, key, expected) -> None:
    e = error_of({**MINIMAL, **override})
    assert e.message.startswith(f"{key}: expected"), e.message
    assert expected in e.message


def test_bad_type_in_a_file_gives_the_line(tmp_path: Path) -> None:
    e = error_of(write(tmp_path, "model: m\ndatasets:\n  - path: d.jsonl\n\nsequence_len: lots\n"))
    assert e.message.startswith("sequence_len:") and e.where.endswith("run.yaml line 5")


def test_yaml_syntax_error_gives_file_and_line(tmp_path: Path) -> None:
    e = error_of(write(tmp_path, "model: m\ndatasets:\n  - path: d.jsonl\n   type: text\n"))
    assert "invalid YAML" in e.message and "run.yaml line 4" in e.where


def test_duplicate_key(tmp_path: Path) -> None:
    e = error_of(write(tmp_path, "model: m\ndatasets: [{path: d}]\nseed: 1\nseed: 2\n"))
    assert "duplicate key 'seed'" in e.message and "lines 3 and 4" in e.message


@pytest.mark.parametrize("text, what", [("", "empty file"), ("- a\n- b\n", "list")])
def test_config_must_be_a_mapping(tmp_path: Path, text: str, what: str) -> None:
    assert what in error_of(write(tmp_path, text)).message


def test_missing_file() -> None:
    assert "not found" in error_of("/nonexistent/run.yaml").message


@pytest.mark.parametrize("source, key", [
    ({"datasets": [{"path": "d"}]}, "'model'"),
    ({"model": "m"}, "'datasets'"),
    ({"model": "m", "datasets": [{"type": "text"}]}, "'datasets[0].path'"),
])
def test_missing_required_key(source, key) -> None:
    e = error_of(source)
    assert e.message == f"missing required key {key}"


@pytest.mark.parametrize("value", ["fp8", "nvfp4"])
def test_quantized_recipes_are_not_supported_yet(value) -> None:
    e = error_of({**MINIMAL, "recipe": value})
    assert e.message == f"recipe: {value!r} is not supported yet" and "bf16" in e.hint


@pytest.mark.parametrize("value", ["fp8_hybrid", "fp8-hybrid"])
def test_fp8_hybrid_is_accepted_in_either_spelling(value) -> None:
    c = load_config({**MINIMAL, "recipe": value})
    assert c.recipe == "fp8_hybrid" and c.fp8 and c.dtype == "bfloat16" and c.fp8_amax_history == 0


@pytest.mark.parametrize("override, key, words", [
    ({"sequence_len": 8}, "sequence_len", "at least 16"),
    ({"max_steps": 0}, "max_steps", "positive"),
    ({"num_epochs": 0}, "num_epochs", "max_steps is -1"),
    ({"warmup_ratio": 1.0}, "warmup_ratio", "[0, 1)"),
    ({"warmup_ratio": 0.1, "warmup_steps": 10}, "warmup_ratio", "warmup_steps"),
    ({"lora_rank": 0}, "lora_rank", "positive"),
    ({"lora_dropout": 1.0}, "lora_dropout", "[0, 1)"),
    ({"learning_rate": 0.0}, "learning_rate", "positive"),
    ({"lora_target_modules": ["all", "q_proj"]}, "lora_target_modules", '"all"'),
    ({"lora_target_modules": []}, "lora_target_modules", "empty"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size", "at least 1"),
    ({"validation_split_ratio": 1.5}, "validation_split_ratio", "[0, 1)"),
    ({"validation_split_ratio": 0.1, "validation_datasets": [{"path": "v"}]}, "validation_split_ratio",
     "validation_datasets"),
    ({"datasets": []}, "datasets", "no datasets"),
    ({"datasets": [{"path": "d", "samples": 0}]}, "datasets[0].samples", "at least 1"),
    ({"adamw_beta2": 1.0}, "adamw_beta2", "[0, 1)"),
    ({"report_to": ["jsonl", "jsonl"]}, "report_to", "twice"),
])
def test_cross_field_and_range_checks(override, key, words) -> None:
    e = error_of({**MINIMAL, **override})
    assert e.message.startswith(f"{key}:"), e.message
    assert words in e.message


def test_max_steps_makes_num_epochs_irrelevant() -> None:
    c = load_config({**MINIMAL, "max_steps": 10, "num_epochs": 0})
    assert c.max_steps == 10


def test_unknown_kind() -> None:
    assert "ppo" in error_of(MINIMAL, kind="ppo").message  # a command with no config kind


def test_error_text_shows_where_and_hint(tmp_path: Path) -> None:
    e = error_of(write(tmp_path, "model: m\ndatasets: [{path: d, type: chat}]\n"))
    text = str(e)
    assert "datasets[0].type" in text and "run.yaml line 2" in text and "HINT: use one of:" in text
