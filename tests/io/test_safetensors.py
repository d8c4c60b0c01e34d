import json
import os

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

from surogate.errors import FileFormatError, InvalidArgumentError, NotFoundError
from surogate.io import (
    PendingTensor,
    SafetensorsFile,
    ShardedCheckpoint,
    open_safetensors,
    save_safetensors,
    save_sharded_safetensors,
)

rng = np.random.default_rng(0)


def sample_tensors():
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    return {
        "f32": f32,
        "f16": f32.astype(np.float16),
        "bf16": f32.astype(ml_dtypes.bfloat16),
        "f8_e4m3": f32.astype(ml_dtypes.float8_e4m3fn),
        "f8_e5m2": f32.astype(ml_dtypes.float8_e5m2),
        "f64": rng.standard_normal(7),
        "i64": np.arange(-3, 3, dtype=np.int64),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "i16": np.array([-2, 7], np.int16),
        "i8": np.array([-128, 127], np.int8),
        "u8": np.array([0, 255, 3], np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "transposed": f32.T,  # not contiguous: written in logical order
    }


def raw_file(path, header, data=b"", header_len=None):
    """A safetensors file with exactly this header and data, however wrong they are."""
    head = json.dumps(header).encode() if isinstance(header, dict) else header
    path.write_bytes((len(head) if header_len is None else header_len).to_bytes(8, "little") + head + data)
    return path


def test_round_trip_every_dtype_as_read_only_views(tmp_path):
    tensors = sample_tensors()
    save_safetensors(tmp_path / "t.safetensors", tensors, metadata={"format": "pt"})
    f = SafetensorsFile(tmp_path / "t.safetensors")
    assert sorted(f.keys()) == sorted(tensors) and f.metadata == {"format": "pt"}
    for name, expected in tensors.items():
        got = f.get(name)
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert got.tobytes() == np.ascontiguousarray(expected).tobytes(), name
        assert not got.flags.writeable and not got.flags.owndata
        assert f.info(name).shape == expected.shape
    assert f.info("bf16").dtype == "BF16" and f.info("f8_e4m3").dtype == "F8_E4M3" and f.info("bool").dtype == "BOOL"
    view = f.get("f32")
    with pytest.raises(ValueError):
        view[0, 0] = 1.0
    f.close()
    assert view.tobytes() == tensors["f32"].tobytes()  # views outlive the file object
    with pytest.raises(InvalidArgumentError, match="closed"):
        f.get("f32")


def test_reference_library_reads_ours(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file as torch_load

    tensors = sample_tensors()
    save_safetensors(tmp_path / "t.safetensors", tensors, metadata={"k": "v"})
    # numpy has no bfloat16 / float8: the reference numpy reader takes the rest, torch takes those.
    with safetensors.safe_open(tmp_path / "t.safetensors", framework="np") as f:
        assert f.metadata() == {"k": "v"}
        for name in ("f32", "f16", "f64", "i64", "i32", "i16", "i8", "u8", "bool", "scalar", "empty", "transposed"):
            np.testing.assert_array_equal(f.get_tensor(name), tensors[name])
            assert f.get_tensor(name).shape == tensors[name].shape
    loaded = torch_load(tmp_path / "t.safetensors")
    for name, bits, np_bits in (("bf16", torch.int16, np.int16), ("f8_e4m3", torch.int8, np.int8),
                                ("f8_e5m2", torch.int8, np.int8)):
        np.testing.assert_array_equal(loaded[name].view(bits).numpy(), tensors[name].view(np_bits))


def test_we_read_the_reference_library(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as torch_save

    tensors = {k: v for k, v in sample_tensors().items() if k not in ("bf16", "f8_e4m3", "f8_e5m2", "transposed")}
    safetensors.numpy.save_file(tensors, tmp_path / "np.safetensors", metadata={"a": "b"})
    f = SafetensorsFile(tmp_path / "np.safetensors")
    assert f.metadata == {"a": "b"}
    for name, expected in tensors.items():
        np.testing.assert_array_equal(f.get(name), expected)

    t = {"w": torch.randn(4, 3).to(torch.bfloat16), "s": torch.randn(5).to(torch.float8_e4m3fn),
         "e": torch.randn(2).to(torch.float8_e5m2)}
    torch_save(t, tmp_path / "pt.safetensors")
    f = SafetensorsFile(tmp_path / "pt.safetensors")
    np.testing.assert_array_equal(f.get("w").view(np.int16), t["w"].view(torch.int16).numpy())
    np.testing.assert_array_equal(f.get("s").view(np.int8), t["s"].view(torch.int8).numpy())
    assert f.get("e").dtype == ml_dtypes.float8_e5m2


def test_we_read_transformers_save_pretrained(llama_dir, qwen3_dir):
    torch = pytest.importorskip("torch")
    for folder in (llama_dir, qwen3_dir):
        ours = SafetensorsFile(folder / "model.safetensors")
        with safetensors.safe_open(folder / "model.safetensors", framework="pt") as ref:
            assert sorted(ours.keys()) == sorted(ref.keys())
            for name in ref.keys():
                want = ref.get_tensor(name)
                got = ours.get(name)
                assert list(got.shape) == list(want.shape), name
                assert got.tobytes() == want.reshape(-1).view(torch.uint8).numpy().tobytes(), name
    assert SafetensorsFile(qwen3_dir / "model.safetensors").info("model.embed_tokens.weight").dtype == "BF16"


def test_sharded_checkpoint_reads_like_one_file(llama_dir, llama_sharded_dir):
    single = SafetensorsFile(llama_dir / "model.safetensors")
    sharded = open_safetensors(llama_sharded_dir / "model.safetensors.index.json")
    assert isinstance(sharded, ShardedCheckpoint) and len(sharded.files) > 2
    assert sorted(sharded.keys()) == sorted(single.keys())
    for name in single.keys():
        np.testing.assert_array_equal(sharded.get(name), single.get(name))
        assert sharded.info(name).shape == single.info(name).shape
    assert sharded.shard_of("lm_head.weight").name.startswith("model-0")
    assert sharded.index_metadata["total_size"] > 0


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    save_safetensors(path, {"a": np.ones(3, np.float32)})
    before = path.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        save_safetensors(path, {"a": np.zeros(1000, np.float32)})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["w.safetensors"]  # no temp file left behind


def test_save_rejects_what_safetensors_cannot_hold(tmp_path):
    with pytest.raises(InvalidArgumentError, match="obj"):
        save_safetensors(tmp_path / "x.safetensors", {"obj": np.array([object()])})
    with pytest.raises(InvalidArgumentError, match="metadata"):
        save_safetensors(tmp_path / "x.safetensors", {"a": np.ones(1)}, metadata={"n": 1})
    assert not list(tmp_path.iterdir())


def test_big_endian_input_is_stored_little_endian(tmp_path):
    a = np.arange(4, dtype=">i4")
    save_safetensors(tmp_path / "be.safetensors", {"a": a})
    np.testing.assert_array_equal(safetensors.numpy.load_file(tmp_path / "be.safetensors")["a"], a)


# -- damaged files: the error names the file and the tensor, and says what to do --

def expect_format_error(path, *needles):
    with pytest.raises(FileFormatError) as e:
        SafetensorsFile(path)
    for needle in (str(path), *needles):
        assert needle in str(e.value)
    assert e.value.hint
    return e.value


def test_truncated_file(tmp_path):
    path = tmp_path / "t.safetensors"
    save_safetensors(path, {"a": np.ones(10, np.float32), "b": np.ones(100, np.float32)})
    path.write_bytes(path.read_bytes()[:-16])
    expect_format_error(path, "'b'", "data ends at byte")


def test_header_length_past_end_of_file(tmp_path):
    expect_format_error(raw_file(tmp_path / "h.safetensors", {}, header_len=10_000), "header claims 10000 bytes")
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    expect_format_error(tmp_path / "short.safetensors", "too short")


def test_header_not_json(tmp_path):
    expect_format_error(raw_file(tmp_path / "j.safetensors", b"{not json"), "not valid JSON")
    expect_format_error(raw_file(tmp_path / "l.safetensors", b"[1, 2]"), "not a JSON object")


def test_unknown_dtype(tmp_path):
    header = {"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 2]}}
    err = expect_format_error(raw_file(tmp_path / "d.safetensors", header, b"\0\0"), "'w'", "'F7'")
    assert "BF16" in err.hint


def test_shape_does_not_match_byte_count(tmp_path):
    header = {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
    expect_format_error(raw_file(tmp_path / "s.safetensors", header, bytes(8)), "'w'", "needs 12 bytes")


def test_overlapping_and_reversed_offsets(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    expect_format_error(raw_file(tmp_path / "o.safetensors", header, bytes(12)), "'a'", "'b'", "overlap")
    header = {"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}}
    expect_format_error(raw_file(tmp_path / "r.safetensors", header, bytes(4)), "'a'", "data_offsets")


def test_missing_files_and_tensors(tmp_path):
    with pytest.raises(NotFoundError, match="nope.safetensors"):
        SafetensorsFile(tmp_path / "nope.safetensors")
    save_safetensors(tmp_path / "t.safetensors", {"model.norm.weight": np.ones(2, np.float32)})
    with pytest.raises(NotFoundError) as e:
        SafetensorsFile(tmp_path / "t.safetensors").get("model.norm.weights")
    assert "model.norm.weights" in str(e.value) and "model.norm.weight?" in e.value.hint


def make_shards(folder):
    save_safetensors(folder / "a.safetensors", {"x": np.ones(2, np.float32)})
    save_safetensors(folder / "b.safetensors", {"y": np.zeros(3, np.int8)})
    index = {"metadata": {"total_size": 11}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder / "model.safetensors.index.json"


def test_missing_shard_is_named(tmp_path):
    index = make_shards(tmp_path)
    assert ShardedCheckpoint(index).get("y").dtype == np.int8
    (tmp_path / "b.safetensors").unlink()
    with pytest.raises(NotFoundError) as e:
        ShardedCheckpoint(index)
    assert "b.safetensors" in str(e.value) and "a.safetensors" in e.value.hint


def test_index_that_disagrees_with_its_shards(tmp_path):
    index = make_shards(tmp_path)
    data = json.loads(index.read_text())
    data["weight_map"]["z"] = "a.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match="'z'.*a.safetensors"):
        ShardedCheckpoint(index)
    index.write_text("{")
    with pytest.raises(FileFormatError, match="not valid JSON"):
        ShardedCheckpoint(index)
    index.write_text(json.dumps({"weight_map": {"x": "../a.safetensors"}}))
    with pytest.raises(FileFormatError, match="outside"):
        ShardedCheckpoint(index)


def test_pending_tensors_are_made_in_turn_and_shards_read_back_with_the_reference(tmp_path):
    made = []

    def pending(name, a):
        return PendingTensor(a.dtype, a.shape, lambda: made.append(name) or a)

    rng = np.random.default_rng(0)
    tensors = {f"t{i}": rng.standard_normal((8, 8 + i)).astype(np.float32) for i in range(6)}
    tensors["q"] = np.arange(16, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).reshape(4, 4)
    written = save_sharded_safetensors(tmp_path, {n: pending(n, a) for n, a in tensors.items()}, max_shard_bytes=700)
    assert sorted(made) == sorted(tensors) and written[-1].name == "model.safetensors.index.json"
    index = json.loads(written[-1].read_text())
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    fp8_shard = index["weight_map"]["q"]  # (the reference's numpy side has no float8 dtypes)
    for name, shard in index["weight_map"].items():  # the other shards as the reference library reads them
        if shard != fp8_shard:
            np.testing.assert_array_equal(safetensors.numpy.load_file(tmp_path / shard)[name], tensors[name])
    assert len(set(index["weight_map"].values())) > 2
    assert (open_safetensors(written[-1]).get("q").view(np.uint8) == np.arange(16).reshape(4, 4)).all()
    with pytest.raises(InvalidArgumentError, match=r"'x' was planned as float32\[2\] but made as float64\[3\]"):
        save_safetensors(tmp_path / "bad.safetensors", {"x": PendingTensor(np.float32, (2,), lambda: np.zeros(3))})
    assert [p.name for p in tmp_path.glob("*bad*")] == []
