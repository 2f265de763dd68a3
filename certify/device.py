"""Device choice, in one place.

certify computes on CUDA when a usable GPU is present and on the CPU otherwise. The torch device
(for perturbations and attacks) and the onnxruntime providers (for ONNX models) are both decided
here, and the decision is logged once.

onnxruntime-gpu lists the CUDA provider even on machines without CUDA and prints a loud error when
asked for it there, so CUDA is only requested when the NVIDIA driver answers with a device.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from certify.errors import UsageError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("certify")

DEVICE_CHOICES = ("auto", "cpu", "cuda")
#: Batches the in-process executor runs at once on the CPU (see ``DeviceChoice.lanes``).
CPU_LANES = 2


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the system reports one (a
    container's or ``taskset``'s limit), else every CPU of the machine."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def cuda_driver_devices() -> int:
    """Number of CUDA devices the NVIDIA driver reports; 0 when there is no driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if lib.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return int(count.value)


@dataclass(frozen=True)
class DeviceChoice:
    """Where a run computes: the torch device and the onnxruntime providers to ask for."""

    requested: str
    torch_device: torch.device
    ort_providers: tuple[str, ...]
    reason: str

    @property
    def name(self) -> str:
        """``cuda`` or ``cpu``."""
        return self.torch_device.type

    @property
    def lanes(self) -> int:
        """Batches the in-process executor runs at once on this device (threads).

        On the CPU ``CPU_LANES`` (at most the cores): while one batch's attack does its Python
        and torch work, another's inference runs in onnxruntime (both release the GIL). On a
        GPU one: its work is already asynchronous.
        """
        return max(1, min(CPU_LANES, os.cpu_count() or 1)) if self.name == "cpu" else 1

    @property
    def onnx_threads(self) -> int:
        """onnxruntime's intra-op threads for an in-process model (0: its default).

        On the CPU the cores are shared out between the lanes: two lanes calling one session
        whose pool spans every core contend for it (10,200 vs 14,600 images/s for two callers
        on 2 cores, benchmarks/onnx_callers.py), while one thread per lane and core scales.
        """
        if self.name != "cpu":
            return 0
        return max(1, (os.cpu_count() or 1) // self.lanes)


def choose_device(requested: str = "auto") -> DeviceChoice:
    """Decide the run's device from ``auto``, ``cpu`` or ``cuda`` and log the decision once."""
    import torch  # here, not at import: `certify --version` and `--help` need no torch

    if requested not in DEVICE_CHOICES:
        raise UsageError(
            f"unknown device {requested!r}", hint=f"use one of {', '.join(DEVICE_CHOICES)}"
        )
    gpus = cuda_driver_devices()
    if requested == "cpu":
        choice = DeviceChoice(requested, torch.device("cpu"), ("CPUExecutionProvider",), "asked")
    elif gpus == 0:
        if requested == "cuda":
            raise UsageError(
                "--device cuda was asked for but no CUDA device is visible",
                hint="check nvidia-smi, or use --device auto to fall back to the CPU",
            )
        choice = DeviceChoice(
            requested, torch.device("cpu"), ("CPUExecutionProvider",), "no CUDA device found"
        )
    else:
        tdev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        choice = DeviceChoice(
            requested,
            tdev,
            ("CUDAExecutionProvider", "CPUExecutionProvider"),
            f"{gpus} CUDA device(s) found",
        )
    if choice.name == "cpu":
        # The model's forward passes run on onnxruntime's own thread pool; certify's tensor
        # work between them is small. A second multi-threaded pool (torch's) spinning beside
        # it made whole runs several times slower on a 2-core machine, so torch stays on one
        # thread (measured in benchmarks/RESULTS.md).
        torch.set_num_threads(1)
    log.info("device: %s (%s)", choice.name, choice.reason)
    return choice
