"""The agent's capability detection produces snapshots the control plane accepts."""

from pathlib import Path

from agent.capabilities import coerce_semver, detect, parse_nvidia_smi
from protocol.capabilities import snapshot


def test_identical_gpus_are_one_entry_with_a_count_and_validate():
    gpus = parse_nvidia_smi("NVIDIA A100-SXM4-40GB, 40960\nNVIDIA A100-SXM4-40GB, 40960\nTesla T4, 15360\n")
    assert gpus == [
        {
            "vendor": "nvidia",
            "model": "NVIDIA A100-SXM4-40GB",
            "memoryMiB": 40960,
            "features": ["cuda"],
            "count": 2,
        },
        {"vendor": "nvidia", "model": "Tesla T4", "memoryMiB": 15360, "features": ["cuda"], "count": 1},
    ]
    document = detect(work_dir=Path("/tmp"), labels={"zone": "eu-1"})
    snapshot({**document, "gpus": gpus})  # raises if the control plane would refuse it


def test_gpu_report_is_capped_at_16_devices_and_skips_garbage():
    gpus = parse_nvidia_smi("Tesla T4, 15360\n" * 20 + "broken line, n/a\n")
    assert sum(g["count"] for g in gpus) == 16


def test_runtime_versions_are_coerced_to_exact_semver():
    assert coerce_semver("GNU bash, version 5.2.15(1)-release") == "5.2.15"
    assert coerce_semver("v20.20.2") == "20.20.2"
    assert coerce_semver("Python 3.11") == "3.11.0"
    assert coerce_semver("no digits") is None


def test_this_machine_detects_a_valid_snapshot(tmp_path):
    document = detect(work_dir=tmp_path, labels={"zone": "eu-1"})
    valid = snapshot(document)
    assert "shell" in valid.document["executors"] and valid.document["cpuCount"] >= 1
