"""YAML -> a validated config Struct, or a ConfigError that names the key, the line and the fix.

Checks run in this order, all before any work starts: YAML syntax (file and line), duplicate
keys, unknown keys (with close matches and the allowed keys), values that are recognised but not
supported yet, types and enums (msgspec), then ranges and cross-field rules. The first failure
is raised. Key paths read like the YAML: ``datasets[0].type``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from surogate.config.kinds import CONFIG_KINDS
from surogate.config.sft import SFTConfig
from surogate.errors import ConfigError

# Keys of the original Surogate (and of other trainers) that have another name here.
_RENAMED = {
    "loss_scale": "train_on",
    "train_seed": "seed",
    "eval_seed": "seed",
    "surogate_metrics_path": "metrics_path",
    "num_train_epochs": "num_epochs",
    "micro_batch_size": "per_device_train_batch_size",
    "lr": "learning_rate",
    "base_model": "model",
    "max_seq_length": "sequence_len",
    "lora_r": "lora_rank",
    "dpo_beta": "beta",
}
# Values of known keys that name features this version does not have.
_NOT_YET = {"recipe": {"fp8", "nvfp4", "fp4", "nvfp4_quartet"}}


def load_config(source: str | os.PathLike | Mapping[str, Any], kind: str = "sft") -> SFTConfig:
    """The config in a YAML file (or an already-parsed mapping), validated. ``kind``: a key of
    CONFIG_KINDS (sft, pt, dpo, distill, grpo)."""
    if kind not in CONFIG_KINDS:
        raise ConfigError(f"unknown config kind {kind!r}", hint=f"use one of: {', '.join(CONFIG_KINDS)}")
    cls = CONFIG_KINDS[kind]
    if isinstance(source, Mapping):
        data, where = dict(source), _Where(None, {})
    else:
        data, where = _read_yaml(Path(source))
    _check_keys(data, msgspec.inspect.type_info(cls), "", where)
    for key, instead in getattr(cls, "not_used", {}).items():
        if key in data:
            raise ConfigError(f"{key}: not used by surogate {kind}", where=where(key), hint=instead)
    _check_not_yet(data, where)
    if data.get("recipe") == "fp8-hybrid":  # the original's other spelling: one value from here on
        data["recipe"] = "fp8_hybrid"
    try:
        config = msgspec.convert(data, cls)
    except msgspec.ValidationError as e:
        raise _from_validation_error(e, data, cls, where) from None
    _check_values(config, where)
    if config.metrics_path is None:
        config = msgspec.structs.replace(config, metrics_path=str(Path(config.output_dir) / "metrics.jsonl"))
    return config


class _Where:
    """Where a key path sits: the file and its 1-based line, for messages."""

    def __init__(self, origin: str | None, lines: dict[str, int]):
        self.origin = origin
        self.lines = lines

    def __call__(self, key: str) -> str | None:
        if self.origin is None:
            return None
        # The nearest enclosing key that has a line ("datasets[0]" for a missing "datasets[0].path").
        while key and key not in self.lines:
            key = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", key) if re.search(r"[.\[]", key) else ""
        line = self.lines.get(key)
        return f"{self.origin} line {line}" if line else self.origin


# -- YAML --

class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 2e-4 as a float (YAML 1.1 wants 2.0e-4, and people write 2e-4)."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _read_yaml(path: Path) -> tuple[dict, _Where]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}", hint="check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"{path} line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise ConfigError(f"invalid YAML: {problem}", where=at,
                          hint="check the indentation and quoting around that line") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}", where=str(path)) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"a config must be a mapping of keys to values, found {found}", where=str(path),
                          hint="write one `key: value` per line, starting with `model:` and `datasets:`")
    lines: dict[str, int] = {}
    _index_lines(node, "", lines, str(path))
    return data, _Where(str(path), lines)


def _index_lines(node: yaml.Node, key: str, lines: dict[str, int], origin: str) -> None:
    lines[key] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            name = str(k.value)
            line = k.start_mark.line + 1
            if name in seen:
                raise ConfigError(f"duplicate key {_join(key, name)!r} (lines {seen[name]} and {line})",
                                  where=f"{origin} line {line}", hint="keep one of them")
            seen[name] = line
            _index_lines(v, _join(key, name), lines, origin)
            lines[_join(key, name)] = line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, f"{key}[{i}]", lines, origin)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# -- checks --

def _check_keys(data: Any, info: msgspec.inspect.Type, key: str, where: _Where) -> None:
    """Unknown keys anywhere in the tree, with the close matches and the allowed keys."""
    info = _unwrap(info)
    if isinstance(info, msgspec.inspect.StructType) and isinstance(data, dict):
        fields = {f.name: f for f in info.fields}
        for name, value in data.items():
            path = _join(key, str(name))
            if name not in fields:
                raise _unknown_key(str(name), path, list(fields), where)
            _check_keys(value, fields[name].type, path, where)
    elif isinstance(info, msgspec.inspect.ListType) and isinstance(data, list):
        for i, item in enumerate(data):
            _check_keys(item, info.item_type, f"{key}[{i}]", where)


def _unknown_key(name: str, path: str, allowed: list[str], where: _Where) -> ConfigError:
    hint = ""
    if name in _RENAMED and _RENAMED[name] in allowed:
        hint = f"this key is called {_RENAMED[name]!r} here. "
    else:
        close = difflib.get_close_matches(name, allowed, n=3, cutoff=0.6)
        if close:
            hint = f"did you mean {' or '.join(map(repr, close))}? "
    hint += f"Allowed keys{' here' if '.' in path or '[' in path else ''}: {', '.join(allowed)}"
    return ConfigError(f"unknown key {path!r}", hint=hint, where=where(path))


def _check_not_yet(data: dict, where: _Where) -> None:
    for key, values in _NOT_YET.items():
        value = data.get(key)
        if isinstance(value, str) and value in values:
            raise ConfigError(f"{key}: {value!r} is not supported yet", where=where(key),
                              hint=f"use {key}: bf16 or fp8_hybrid on a GPU, or fp32 on the CPU")


def _from_validation_error(e: msgspec.ValidationError, data: dict, cls: type, where: _Where) -> ConfigError:
    # msgspec says e.g. "Invalid enum value 'x' - at `$.datasets[0].type`".
    match = re.fullmatch(r"(?s)(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?", str(e))
    message, path = match["msg"], (match["path"] or "").lstrip(".")
    missing = re.fullmatch(r"Object missing required field `(.+)`", message)
    if missing:
        key = _join(path, missing[1])
        return ConfigError(f"missing required key {key!r}", where=where(path),
                           hint=f"add `{missing[1]}:` ({_describe(_type_at(cls, key))})")
    info = _type_at(cls, path)
    value = _value_at(data, path)
    expected = _describe(info) if info is not None else None
    if message.startswith("Invalid enum value") or isinstance(_unwrap(info), msgspec.inspect.LiteralType):
        return ConfigError(f"{path}: {value!r} is not an allowed value", where=where(path),
                           hint=f"use {expected}" if expected else None)
    if message.startswith("Expected") and expected:
        hint = "write it as a YAML list of mappings:  - path: ..." if path.endswith("datasets") else None
        return ConfigError(f"{path}: expected {expected}, got {value!r} ({_yaml_type(value)})",
                           where=where(path), hint=hint)
    return ConfigError(f"{path}: {message}", where=where(path))


def _check_values(c: SFTConfig, where: _Where) -> None:
    def fail(key: str, problem: str, hint: str | None = None):
        raise ConfigError(f"{key}: {problem}", hint=hint, where=where(key))

    if not c.datasets:
        fail("datasets", "no datasets given", "list at least one: datasets: [{path: data/train.jsonl}]")
    for group in ("datasets", "validation_datasets"):
        for i, d in enumerate(getattr(c, group)):
            if not d.path.strip():
                fail(f"{group}[{i}].path", "empty path", "a local file or folder, or a hub dataset id (org/name)")
            if d.samples is not None and d.samples < 1:
                fail(f"{group}[{i}].samples", f"must be at least 1, got {d.samples}", "remove it to read every row")
            if c.kind == "pt" and d.train_on not in (None, "all"):
                fail(f"{group}[{i}].train_on", f"pretraining trains on every token, got {d.train_on!r}",
                     "remove it (surogate pt always uses all)")
    for group in ("datasets", "validation_datasets"):
        for i, d in enumerate(getattr(c, group)):
            if c.kind == "dpo" and d.type not in ("auto", "preference"):
                fail(f"{group}[{i}].type", f"surogate dpo trains on preference rows, got {d.type!r}",
                     "use type: preference (rows with prompt, chosen and rejected)")
            if c.kind != "dpo" and d.type == "preference":
                fail(f"{group}[{i}].type", f"preference rows train with surogate dpo, not surogate {c.kind}",
                     "run `surogate dpo` with this dataset, or use a messages / instruction / text dataset")
            if c.kind == "grpo" and d.type not in ("auto", "prompt"):
                fail(f"{group}[{i}].type", f"surogate grpo samples completions for prompts, got {d.type!r}",
                     "use type: prompt (rows with a prompt: a string or a list of messages)")
            if c.kind != "grpo" and d.type == "prompt":
                fail(f"{group}[{i}].type", f"prompt-only rows train with surogate grpo, not surogate {c.kind}",
                     "run `surogate grpo` with this dataset, or use a messages / instruction / text dataset")
    if c.kind == "dpo":
        _check_dpo(c, fail)
    if c.kind == "grpo":
        _check_grpo(c, fail)
    if c.kind == "distill":
        d = c.distillation
        if not d.teacher_model.strip():
            fail("distillation.teacher_model", "empty path", "a local HF model folder with the student's tokenizer")
        if not 1 <= d.top_k <= 64:
            fail("distillation.top_k", f"must be in [1, 64], got {d.top_k}",
                 "each teacher token costs one forward + backward pass of the student; 4 to 16 is typical")
        for key in ("kd_weight", "ce_weight"):
            if getattr(d, key) < 0:
                fail(f"distillation.{key}", f"must not be negative, got {getattr(d, key)}")
        if d.kd_weight == 0 and d.ce_weight == 0:
            fail("distillation.kd_weight", "kd_weight and ce_weight are both 0: nothing to train on",
                 "set kd_weight (the KL to the teacher) above 0")
    if c.validation_datasets and c.validation_split_ratio:
        fail("validation_split_ratio", "set together with validation_datasets",
             "use one: validation_datasets, or a split of the training data")
    if c.validation_split_ratio is not None and not 0 <= c.validation_split_ratio < 1:
        fail("validation_split_ratio", f"must be in [0, 1), got {c.validation_split_ratio}", "0.1 holds out 10%")
    if c.sequence_len < 16:
        fail("sequence_len", f"must be at least 16, got {c.sequence_len}", "typical values: 1024 to 8192")
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps"):
        if getattr(c, key) < 1:
            fail(key, f"must be at least 1, got {getattr(c, key)}")
    if c.gpus < 0:
        fail("gpus", f"must not be negative, got {c.gpus}", "1 trains on one device, 0 on every GPU of the machine")
    if c.zero_level not in (0, 1, 2, 3):
        fail("zero_level", f"must be 0, 1, 2 or 3, got {c.zero_level}",
             "0: plain data parallel, 1: optimizer state sharded, 2: gradients too, 3: the layers' weights too")
    if c.zero_level == 3 and c.kind == "grpo":
        fail("zero_level", "ZeRO-3 shards the layers' weights, and each rank's rollout engine reads them whole",
             "use zero_level: 2 with surogate grpo")
    if c.distributed is not None:
        if c.distributed.num_nodes < 0:
            fail("distributed.num_nodes", f"must not be negative, got {c.distributed.num_nodes}",
                 "the ranks, one per node; 0 uses every node of the Ray cluster")
        if c.gpus > 1:
            fail("gpus", f"gpus: {c.gpus} with distributed: several ranks per node are not built yet",
                 "set gpus: 1 (one rank per node)")
    if c.max_steps == 0 or c.max_steps < -1:
        fail("max_steps", f"must be positive, or -1 to let num_epochs decide; got {c.max_steps}")
    if c.max_steps == -1 and c.num_epochs < 1:
        fail("num_epochs", f"must be at least 1 when max_steps is -1, got {c.num_epochs}",
             "set num_epochs, or max_steps to a number of optimizer steps")
    if c.num_epochs < 0:
        fail("num_epochs", f"must not be negative, got {c.num_epochs}")
    if not c.learning_rate > 0:
        fail("learning_rate", f"must be positive, got {c.learning_rate}", "LoRA typically uses 1e-4 to 3e-4")
    if c.warmup_steps < 0:
        fail("warmup_steps", f"must not be negative, got {c.warmup_steps}")
    if not 0 <= c.warmup_ratio < 1:
        fail("warmup_ratio", f"must be in [0, 1), got {c.warmup_ratio}", "0.05 warms up over 5% of the steps")
    if c.warmup_steps and c.warmup_ratio:
        fail("warmup_ratio", "set together with warmup_steps", "use one of warmup_steps and warmup_ratio")
    if not 0 < c.wsd_decay_steps_fraction <= 1:
        fail("wsd_decay_steps_fraction", f"must be in (0, 1], got {c.wsd_decay_steps_fraction}")
    if not 0 <= c.final_lr_fraction <= 1:
        fail("final_lr_fraction", f"must be in [0, 1], got {c.final_lr_fraction}")
    if c.weight_decay < 0:
        fail("weight_decay", f"must not be negative, got {c.weight_decay}")
    if c.max_grad_norm < 0:
        fail("max_grad_norm", f"must not be negative, got {c.max_grad_norm}", "0 disables clipping")
    for key in ("adamw_beta1", "adamw_beta2"):
        if not 0 <= getattr(c, key) < 1:
            fail(key, f"must be in [0, 1), got {getattr(c, key)}")
    if not c.adamw_epsilon > 0:
        fail("adamw_epsilon", f"must be positive, got {c.adamw_epsilon}")
    if c.lora_rank <= 0:
        fail("lora_rank", f"must be positive, got {c.lora_rank}", "typical values: 8 to 64")
    if not c.lora_alpha > 0:
        fail("lora_alpha", f"must be positive, got {c.lora_alpha}", "often twice lora_rank")
    if not 0 <= c.lora_dropout < 1:
        fail("lora_dropout", f"must be in [0, 1), got {c.lora_dropout}")
    if c.qlora_gguf is not False:
        if not c.lora:
            fail("qlora_gguf", "needs lora: true (quantized weights stay frozen; only adapters train)",
                 "set lora: true, or drop qlora_gguf for a full fine-tune")
        if isinstance(c.qlora_gguf, str):
            from surogate.io.gguf_writer import QUANT_TYPES

            blocks = [t for t in QUANT_TYPES if t not in ("F32", "F16", "BF16")]
            if c.qlora_gguf.upper() not in blocks:
                fail("qlora_gguf", f"{c.qlora_gguf!r} is not a block type", "use true (a GGUF model's own blocks) "
                     "or one of " + ", ".join(blocks))
    if c.qlora_bnb:
        from surogate.io.nf4 import BLOCKSIZES

        if not c.lora:
            fail("qlora_bnb", "needs lora: true (quantized weights stay frozen; only adapters train)",
                 "set lora: true, or drop qlora_bnb for a full fine-tune")
        if c.qlora_gguf is not False:
            fail("qlora_bnb", "together with qlora_gguf: the base is kept one way", "pick one of them")
        if c.qlora_bnb_block_size not in BLOCKSIZES:
            fail("qlora_bnb_block_size", f"{c.qlora_bnb_block_size} is not a bitsandbytes block size",
                 "use one of " + ", ".join(map(str, BLOCKSIZES)) + " (64 is QLoRA's)")
    for key in ("normuon_momentum", "normuon_beta2"):
        if not 0 <= getattr(c, key) < 1:
            fail(key, f"must be in [0, 1), got {getattr(c, key)}")
    if not c.normuon_epsilon > 0:
        fail("normuon_epsilon", f"must be positive, got {c.normuon_epsilon}")
    if c.muon_learning_rate is not None and not c.muon_learning_rate > 0:
        fail("muon_learning_rate", f"must be positive, got {c.muon_learning_rate}", "or leave it unset")
    if c.muon_ns_steps < 1:
        fail("muon_ns_steps", f"must be at least 1, got {c.muon_ns_steps}", "5 is Muon's")
    if len(c.muon_ns_coefficients) != 3:
        fail("muon_ns_coefficients", f"needs 3 numbers (a, b, c), got {len(c.muon_ns_coefficients)}",
             "Muon's quintic: [3.4445, -4.7750, 2.0315]")
    targets = c.lora_target_modules
    if not targets:
        fail("lora_target_modules", "empty list", 'use ["all"] or names such as q_proj, v_proj')
    if "all" in targets and len(targets) > 1:
        fail("lora_target_modules", '"all" together with other names', 'use ["all"] alone, or list the names')
    if len(set(targets)) != len(targets):
        fail("lora_target_modules", "a name is listed twice")
    if not c.router_z_loss_coef >= 0:
        fail("router_z_loss_coef", f"must not be negative, got {c.router_z_loss_coef}", "ST-MoE used 0.001")
    for key in ("save_steps", "save_total_limit", "eval_steps"):
        if getattr(c, key) < 0:
            fail(key, f"must not be negative, got {getattr(c, key)}")
    if isinstance(c.resume_from_checkpoint, str) and not c.resume_from_checkpoint.strip():
        fail("resume_from_checkpoint", "empty path", "true resumes from the latest checkpoint in output_dir")
    if len(set(c.report_to)) != len(c.report_to):
        fail("report_to", "a reporter is listed twice")
    _check_fp8(c, fail)


def _check_fp8(c, fail) -> None:
    keys = ("fp8_amax_history", "skip_quant_first_layers", "skip_quant_last_layers")
    for key in keys:
        if getattr(c, key) < 0:
            fail(key, f"must not be negative, got {getattr(c, key)}")
    if not c.fp8:
        for key in keys:
            if getattr(c, key):
                fail(key, f"applies to recipe: fp8_hybrid, not {c.recipe}", "set recipe: fp8_hybrid, or remove it")
        return
    for key in ("qlora_gguf", "qlora_bnb"):
        if getattr(c, key) is not False:
            fail(key, "together with recipe: fp8_hybrid: the quantized base weights are not FP8 GEMM operands",
                 "use recipe: bf16 for QLoRA, or drop the QLoRA key to train over bf16 weights in FP8")


def _check_dpo(c, fail) -> None:
    if not c.beta > 0:
        fail("beta", f"must be positive, got {c.beta}", "TRL's default is 0.1")
    if not 0 <= c.label_smoothing < 0.5:
        fail("label_smoothing", f"must be in [0, 0.5), got {c.label_smoothing}", "0 is plain DPO")
    if c.label_smoothing and c.loss_type != "sigmoid":
        fail("label_smoothing", f"applies to loss_type: sigmoid only, not {c.loss_type!r}", "remove it")
    if c.max_length < 16:
        fail("max_length", f"must be at least 16, got {c.max_length}", "prompt + completion tokens, e.g. 1024")
    for key in ("max_prompt_length", "max_completion_length"):
        value = getattr(c, key)
        if value is not None and value < 1:
            fail(key, f"must be at least 1, got {value}", "null: no limit of its own (max_length still applies)")


def _check_grpo(c, fail) -> None:
    if c.num_generations < 2:
        fail("num_generations", f"must be at least 2, got {c.num_generations}",
             "the advantages compare the completions of one prompt; 8 is typical")
    for key in ("max_prompt_length", "max_completion_length"):
        if getattr(c, key) < 1:
            fail(key, f"must be at least 1, got {getattr(c, key)}")
    if not c.temperature > 0:
        fail("temperature", f"must be positive, got {c.temperature}", "GRPO needs varied samples; 1.0 is typical")
    if not 0 < c.top_p <= 1:
        fail("top_p", f"must be in (0, 1], got {c.top_p}")
    if c.top_k < 0:
        fail("top_k", f"must not be negative, got {c.top_k}", "0 turns it off")
    if not c.reward_functions:
        fail("reward_functions", "no reward functions given",
             'list at least one: "pkg.module:fn" or a built-in name such as arithmetic_exact')
    if c.reward_weights is not None and len(c.reward_weights) != len(c.reward_functions):
        fail("reward_weights", f"{len(c.reward_weights)} weights for {len(c.reward_functions)} reward functions",
             "give one weight per reward function, or remove reward_weights (all 1)")
    if c.beta < 0:
        fail("beta", f"must not be negative, got {c.beta}", "0 drops the KL penalty (and the reference pass)")
    if not 0 < c.epsilon < 1:
        fail("epsilon", f"must be in (0, 1), got {c.epsilon}", "TRL's default is 0.2")
    if c.epsilon_high is not None and not c.epsilon_high > 0:
        fail("epsilon_high", f"must be positive, got {c.epsilon_high}", "DAPO uses 0.28")
    if c.num_iterations < 1:
        fail("num_iterations", f"must be at least 1, got {c.num_iterations}",
             "the optimizer passes over each batch of rollouts; 1 (on-policy) is TRL's default")


# -- type descriptions for messages --

def _unwrap(info):
    # `X | None`: describe and walk X.
    if isinstance(info, msgspec.inspect.UnionType):
        rest = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
        if len(rest) == 1:
            return rest[0]
    return info


def _type_at(cls: type, path: str):
    info = msgspec.inspect.type_info(cls)
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        info = _unwrap(info)
        if part.startswith("["):
            if not isinstance(info, msgspec.inspect.ListType):
                return None
            info = info.item_type
        elif isinstance(info, msgspec.inspect.StructType):
            info = next((f.type for f in info.fields if f.name == part), None)
            if info is None:
                return None
        else:
            return None
    return info


def _value_at(data: Any, path: str) -> Any:
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        try:
            data = data[int(part[1:-1])] if part.startswith("[") else data[part]
        except (KeyError, IndexError, TypeError, ValueError):
            return None
    return data


def _describe(info) -> str:
    T = msgspec.inspect
    if info is None:
        return "a value"
    if isinstance(info, T.UnionType):
        return " or ".join(_describe(t) for t in info.types)
    if isinstance(info, T.LiteralType):
        return "one of: " + ", ".join(map(str, info.values))
    if isinstance(info, T.ListType):
        item = info.item_type
        if isinstance(item, T.LiteralType):
            return f"a list of values, each {_describe(item)}"
        if isinstance(item, T.StructType):
            return f"a list of mappings (keys: {', '.join(f.name for f in item.fields)})"
        return f"a list of {_describe(item).removeprefix('a ').removeprefix('an ')}s"
    if isinstance(info, T.StructType):
        return f"a mapping (keys: {', '.join(f.name for f in info.fields)})"
    return {T.IntType: "an integer", T.FloatType: "a number", T.BoolType: "true or false", T.StrType: "a string",
            T.NoneType: "null"}.get(type(info), type(info).__name__)


def _yaml_type(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "null"}.get(type(value), type(value).__name__)
