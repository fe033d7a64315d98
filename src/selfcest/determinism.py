"""The same weights from the same seed on every x86 CPU: pin PyTorch's vectorised CPU kernels.

PyTorch picks its vectorised CPU kernels (softmax, reductions, element-wise ops) by the instruction
set it finds: AVX-512 where the CPU has it, AVX2 otherwise. The two sum in different orders, so the
same seed trains different weights on different machines. Measured on this project's two CPU kinds
(both 2 cores): the warm-up's logged grad norm differs at step 100 (3.581713 vs 3.581715), the runs
drift apart, and the default pipeline ends in different checkpoints and reports (`qa/test` 62.5% on
the AVX2 machine, 100% on the AVX-512 one). With `ATEN_CPU_CAPABILITY=avx2` the AVX-512 machine
logs the AVX2 machine's warm-up to the last digit (`MKL_CBWR=AVX2` or `ONEDNN_MAX_CPU_ISA=AVX2`
alone does not change a digit). AVX2 is what every x86 machine of the last decade has, so it is the
common ground; the price on an AVX-512 machine is small (the warm-up ran at ~12 steps/s pinned and
~13 unpinned).

This has to run before `torch` is first imported (ATen reads the variable once); the DVC stages do it
in `stages/__init__.py`. A value the user already set wins, and `SELFCEST_CPU_KERNELS=native` turns
the pinning off. The number of torch threads did not matter in the same test (1, 2, 4 and 8 threads
logged the same first 200 warm-up steps); other architectures (ARM) and GPUs are not covered.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import warnings
from collections.abc import MutableMapping
from pathlib import Path

KERNEL_VARIABLE = "ATEN_CPU_CAPABILITY"
PINNED_CAPABILITY = "avx2"
OPT_OUT_VARIABLE = "SELFCEST_CPU_KERNELS"


def _cpuinfo_fields(cpuinfo: Path) -> list[tuple[str, str]]:
    """(name, value) of every `name : value` line of /proc/cpuinfo (Linux), in order; empty where it
    cannot be read. One reader for the flags and the identity below."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [(name.strip(), value) for name, _, value in (line.partition(":") for line in text.splitlines())]


def installed_version(distribution: str) -> str | None:
    """A distribution's installed version (`importlib.metadata`, so nothing is imported), None when
    it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty where it cannot be read."""
    return next((set(value.split()) for name, value in _cpuinfo_fields(cpuinfo) if name == "flags"), set())


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str | None]:
    """The CPU's vendor (`GenuineIntel`, `AuthenticAMD`) and model name from /proc/cpuinfo (Linux),
    None where they cannot be read."""
    found: dict[str, str | None] = {"vendor_id": None, "model name": None}
    for name, value in _cpuinfo_fields(cpuinfo):
        if name in found and found[name] is None:
            found[name] = value.strip() or None
    return {"cpu_vendor": found["vendor_id"], "cpu_model": found["model name"]}


def machine_description(
    environ: MutableMapping[str, str] | None = None, cpuinfo: Path = Path("/proc/cpuinfo")
) -> dict[str, str | None]:
    """What decides a CPU run's arithmetic besides the code and the seed, for a training stage's
    metrics file: the CPU vendor and model, the ATen kernels in force, and torch's version.

    The pin above makes the two AMD kinds agree, but MKL's matrix products still choose their
    kernels by CPU vendor, so an Intel and an AMD machine train other weights from the same seed
    (README, "Environment notes"). Reviewers diffing `dvc metrics` across commits then need to see
    which kind a run came from. Not for model cards: DVC hashes those with the weights, and the two
    AMD kinds' identical weights would look like different checkpoints."""
    return {
        **cpu_identity(cpuinfo),
        "cpu_kernels": kernels_in_force(environ),
        "torch": installed_version("torch"),
    }


def kernels_in_force(environ: MutableMapping[str, str] | None = None) -> str:
    """The ATen CPU kernels this process runs, lower case (`avx2`, `avx512`, `default`).

    Once torch is loaded, torch's own answer: ATen ignores a value it does not know (`AVX2`,
    `" avx2"`, an empty one) with a warning and picks the CPU's level, and a variable set after torch
    was imported is not read at all, so the variable alone could name kernels that are not the ones
    running. Before torch is loaded, or for a given `environ` (not this process's): the variable as
    `pin_cpu_kernels` left it, or `native` (torch's own choice) where it is unset."""
    if environ is None and "torch" in sys.modules:
        import torch

        return torch.backends.cpu.get_cpu_capability().lower()
    environ = os.environ if environ is None else environ
    return environ.get(KERNEL_VARIABLE) or "native"


def pin_cpu_kernels(
    environ: MutableMapping[str, str] | None = None, flags: set[str] | None = None
) -> str | None:
    """Pin ATen's CPU kernels to AVX2 where the CPU has AVX2 and FMA (the level ATen would pick on an
    AVX2 machine). Returns the capability now in force through the variable, or None where nothing is
    pinned (opted out, no AVX2, not x86). Never overrides a value already set."""
    environ = os.environ if environ is None else environ
    if environ.get(OPT_OUT_VARIABLE, "").strip().lower() == "native":
        return None
    if KERNEL_VARIABLE in environ:
        return environ[KERNEL_VARIABLE] or None  # set but empty: ATen ignores it, nothing is pinned
    flags = cpu_flags() if flags is None else flags
    if not {"avx2", "fma"} <= flags:
        return None
    if environ is os.environ and "torch" in sys.modules:
        warnings.warn(
            f"selfcest.determinism: torch was imported before {KERNEL_VARIABLE} was set; "
            "this process keeps the kernels torch chose",
            RuntimeWarning,
            stacklevel=2,
        )
    environ[KERNEL_VARIABLE] = PINNED_CAPABILITY
    return PINNED_CAPABILITY
