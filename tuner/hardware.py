"""The machine a measurement was taken on: every result is stated next to it."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class HardwareInfo:
    accelerator: str  # "cuda" or "cpu"
    gpu_model: str | None
    gpu_memory_gib: float | None
    gpu_count: int
    cpu_model: str
    cpu_cores: int
    memory_gib: float

    def describe(self) -> str:
        if self.accelerator == "cuda":
            return f"{self.gpu_count} x {self.gpu_model} ({self.gpu_memory_gib:.0f} GiB)"
        return f"CPU: {self.cpu_model}, {self.cpu_cores} cores, {self.memory_gib:.0f} GiB RAM"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HardwareInfo:
        """The machine `to_dict` gave."""
        return cls(**data)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def _gpus() -> list[tuple[str, float]]:
    """(name, memory GiB) per GPU visible to this process, from nvidia-smi; none without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        name, _, mib = line.rpartition(",")
        try:
            gpus.append((name.strip(), float(mib) / 1024))
        except ValueError:
            continue
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        wanted = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        gpus = [gpus[i] for i in wanted if i < len(gpus)]
    return gpus


def detect_hardware() -> HardwareInfo:
    gpus = _gpus()
    return HardwareInfo(
        accelerator="cuda" if gpus else "cpu",
        gpu_model=gpus[0][0] if gpus else None,
        gpu_memory_gib=gpus[0][1] if gpus else None,
        gpu_count=len(gpus),
        cpu_model=_cpu_model(),
        cpu_cores=os.cpu_count() or 1,
        memory_gib=_memory_gib(),
    )
