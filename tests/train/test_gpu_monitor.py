"""GPU samples: parsing nvidia-smi's CSV (a stand-in script on PATH plays the driver tool, since
CI has no GPU) and the feed's "gpu" lines; no samples and no thread without nvidia-smi."""

import json
import os
import stat
import time

from surogate.train.gpu_monitor import sample_gpus
from surogate.train.metrics import MetricsFeed

CSV = "0, NVIDIA H200, 87, 51234, 143771, 61, 512.33\n1, NVIDIA H200, [N/A], 10, 143771, 40, [Not Supported]\n"


def fake_smi(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{CSV}EOF\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")


def test_samples_parse_every_field_and_tolerate_na(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch)
    gpus = sample_gpus()
    assert gpus[0] == {"index": 0, "name": "NVIDIA H200", "utilization": 87.0, "memory_used_mib": 51234.0,
                       "memory_total_mib": 143771.0, "temperature_c": 61.0, "power_w": 512.33}
    assert gpus[1]["utilization"] is None and gpus[1]["power_w"] is None


def test_feed_writes_gpu_lines_while_open(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch)
    feed = MetricsFeed(tmp_path / "m.jsonl", gpu_interval=0.05, stream=open(os.devnull, "w"))
    time.sleep(0.3)
    feed.close()
    lines = [json.loads(x) for x in open(tmp_path / "m.jsonl")]
    gpu = [x for x in lines if x["type"] == "gpu"]
    assert gpu and gpu[0]["gpus"][0]["name"] == "NVIDIA H200"


def test_no_nvidia_smi_means_no_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sample_gpus() is None
    feed = MetricsFeed(tmp_path / "m.jsonl", gpu_interval=0.05, stream=open(os.devnull, "w"))
    assert feed._gpu is None
    feed.close()
