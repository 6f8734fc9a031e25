"""Hardware detection: which GPUs CUDA_VISIBLE_DEVICES leaves a process, and the fallback where NVML is absent.

There is no GPU where the suite runs: the mapping is tested as the pure function it is, on made-up UUIDs in
place of NVML's answers, and detection is tested on this machine's real, missing, NVIDIA library."""

from __future__ import annotations

import os

import psutil
import pytest

from tuner.common.hardware import detect_hardware, visible_gpus

MACHINE = ["GPU-aaaa1111-0000", "GPU-aaaa2222-0000", "GPU-bbbb3333-0000"]  # NVML's order


@pytest.mark.parametrize("setting, visible", [
    (None, MACHINE),
    ("", []),
    ("2,0", [MACHINE[2], MACHINE[0]]),
    ("0, 1", MACHINE[:2]),
    ("0,2,-1,1", [MACHINE[0], MACHINE[2]]),  # CUDA stops at the first entry that names no device
    ("1,7,0", [MACHINE[1]]),
    ("GPU-bbbb3333-0000,0", [MACHINE[2], MACHINE[0]]),
    ("GPU-bbbb", [MACHINE[2]]),  # a prefix that names one GPU alone
    ("GPU-aaaa", []),  # a prefix of two GPUs names neither
    ("GPU-cccc", []),
    ("MIG-1234abcd", ["MIG-1234abcd"]),  # only NVML knows MIG devices
])
def test_cuda_visible_devices_map_to_the_gpus_cuda_shows(setting, visible):
    assert visible_gpus(setting, MACHINE) == visible


def test_without_an_nvidia_library_the_machine_is_its_cpu():
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    hardware = detect_hardware()
    assert (hardware.accelerator, hardware.gpu_count, hardware.gpu_model) == ("cpu", 0, None)
    assert hardware.cpu_cores == psutil.cpu_count()
    assert detect_hardware() is hardware  # detected once per process
