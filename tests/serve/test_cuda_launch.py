"""launch() on a GPU with its defaults while another process holds part of the GPU: the profile
run sizes the KV cache to what is left of --gpu-memory-utilization, the model serves a request,
and our process plus the other stay inside the fraction; with too little left, one error that
gives the numbers and the flag. Skipped without a CUDA build and a GPU; the lead runs it on the
H200."""

from __future__ import annotations

import subprocess
import sys

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

from sgtest.engine import generate  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.errors import InvalidArgumentError  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

GiB = 1 << 30
# Another process: takes `fraction` of GPU 0 with plain cudaMalloc (our allocator, its own
# process), says so, and holds it until its stdin closes.
HOLDER = """
import sys
from surogate import _native
total = _native.device_memory("cuda")["total_bytes"]
held = _native.empty([int(float(sys.argv[1]) * total)], "uint8", "cuda")
print("holding", flush=True)
sys.stdin.read()
"""


class OtherProcess:
    def __init__(self, fraction: float):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(fraction)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __enter__(self):
        assert self.proc.stdout.readline().strip() == "holding"
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def close(m) -> None:
    m.client.close()
    m.runner.close()
    _native.empty_cache(m.model.device)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    # KV heads of a real model's width: 4 KiB a token, so the ~80 GiB an H200 has left is 20M tokens
    return make_qwen3(tmp_path_factory.mktemp("q"), seed=3, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=64)


def test_the_defaults_start_beside_another_process(path):
    total = _native.device_memory("cuda")["total_bytes"]
    with OtherProcess(0.3):
        free_before = _native.device_memory("cuda")["free_bytes"]
        assert free_before < 0.75 * total  # the other process's memory is not ours to give the KV cache
        m = launch(str(path), device="cuda", dtype="auto")
        try:
            out = generate(m.client, [[5, 6, 7, 8]], 8)
            assert len(out[0]) == 8
            mem = _native.device_memory("cuda")
            used = mem["total_bytes"] - mem["free_bytes"]
            assert used <= 0.9 * total  # the other process and all of ours (KV cache, steps, graphs)
            s = m.model.spec
            assert m.kv_cache_tokens * 2 * s.num_layers * s.num_kv_heads * s.head_dim * 2 > 0.5 * total  # of ~0.6
        finally:
            close(m)


def test_no_room_left_is_one_error_naming_the_flag(path):
    with OtherProcess(0.93):
        with pytest.raises(InvalidArgumentError) as e:
            launch(str(path), device="cuda", dtype="auto")
    msg = str(e.value) + str(e.value.hint)
    assert "--gpu-memory-utilization 0.9" in msg
    assert "other processes and this one's CUDA context hold" in msg
    assert "raise --gpu-memory-utilization to 0.9" in msg
