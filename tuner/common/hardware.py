"""The machine a measurement was taken on: every result is stated next to it."""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import psutil
import pynvml


@dataclass(frozen=True)
class HardwareInfo:
    """The machine a trial ran on, stored beside its measurement; the GPU fields describe the first GPU."""

    accelerator: str  # "cuda" or "cpu"
    gpu_model: str | None
    gpu_memory_gib: float | None
    gpu_count: int
    cpu_model: str
    cpu_cores: int
    memory_gib: float
    gpu_compute_capability: float | None = None  # of the first GPU, e.g. 9.0 for Hopper; None without one

    def fp8_unsupported(self) -> str | None:
        """Why FP8 weights and KV cache cannot run here (vLLM's CPU build has neither, and a GPU needs compute
        capability 8.9: Ada or Hopper); None where they can."""
        if self.accelerator != "cuda":
            return "vLLM's CPU build has no FP8 weights or KV cache"
        if self.gpu_compute_capability is not None and self.gpu_compute_capability < 8.9:
            return (f"FP8 needs a GPU of compute capability 8.9 or later (Ada, Hopper); the {self.gpu_model} has "
                    f"{self.gpu_compute_capability:g}")
        return None

    def describe(self) -> str:
        """The machine in a few words: the GPUs' count, model and memory, or the CPU's model and cores and the RAM."""
        if self.accelerator == "cuda":
            return f"{self.gpu_count} x {self.gpu_model} ({self.gpu_memory_gib:.0f} GiB)"
        return f"CPU: {self.cpu_model}, {self.cpu_cores} cores, {self.memory_gib:.0f} GiB RAM"

    def to_dict(self) -> dict:
        """Every field, JSON-ready: what `from_dict` reads back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HardwareInfo:
        """The machine `to_dict` gave."""
        return cls(**data)


def _cpu_model() -> str:
    # psutil has no CPU model name: /proc/cpuinfo on Linux, the platform's guess elsewhere.
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def visible_gpus(cuda_visible_devices: str | None, uuids: Sequence[str]) -> list[str]:
    """The UUIDs of the devices CUDA shows a process, in CUDA's order.

    `uuids` are the machine's GPUs in NVML's order (PCI bus order: CUDA's too under CUDA_DEVICE_ORDER=PCI_BUS_ID,
    and the same GPUs whatever the order on a machine of one GPU model). Unset CUDA_VISIBLE_DEVICES shows every
    GPU. Otherwise each entry is an index, a GPU UUID or a prefix that names one GPU alone, or a MIG device UUID
    (passed through: only NVML can tell whether it exists); as CUDA does, the list ends at the first entry that
    names no device, so an empty value shows none."""
    if cuda_visible_devices is None:
        return list(uuids)
    visible = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry.isdigit() and int(entry) < len(uuids):
            visible.append(uuids[int(entry)])
        elif entry.startswith("MIG-"):
            visible.append(entry)
        elif entry.startswith("GPU-") and len(named := [u for u in uuids if u.startswith(entry)]) == 1:
            visible.append(named[0])
        else:
            break
    return visible


def _gpus(cuda_visible_devices: str | None) -> list[tuple[str, float, float]]:
    """(name, memory GiB, compute capability) per GPU this process may use, from NVML; none where there is no NVIDIA
    driver."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no libnvidia-ml (no driver), or a driver that does not answer
        return []
    try:
        uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = []
        for uuid in visible_gpus(cuda_visible_devices, uuids):
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except pynvml.NVMLError_NotFound:  # a MIG UUID of no device: CUDA's list ends there
                break
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append((pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30,
                         major + minor / 10))
        return gpus
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def detect_hardware() -> HardwareInfo:
    """The machine this process runs on: the GPUs CUDA lets it use (CUDA_VISIBLE_DEVICES applied), its CPU and
    memory. Detected once per process and value of CUDA_VISIBLE_DEVICES (Ray sets it as a worker starts)."""
    return _detect(os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.cache
def _detect(cuda_visible_devices: str | None) -> HardwareInfo:
    gpus = _gpus(cuda_visible_devices)
    return HardwareInfo(
        accelerator="cuda" if gpus else "cpu",
        gpu_model=gpus[0][0] if gpus else None,
        gpu_memory_gib=gpus[0][1] if gpus else None,
        gpu_count=len(gpus),
        cpu_model=_cpu_model(),
        cpu_cores=psutil.cpu_count() or 1,
        memory_gib=psutil.virtual_memory().total / 2**30,
        gpu_compute_capability=gpus[0][2] if gpus else None,
    )
