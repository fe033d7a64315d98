"""CPU kernel pinning: the DVC stages run torch's AVX2 kernels on every x86 CPU that has them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from selfcest.determinism import (
    KERNEL_VARIABLE,
    OPT_OUT_VARIABLE,
    cpu_flags,
    machine_description,
    pin_cpu_kernels,
)

ROOT = Path(__file__).resolve().parents[1]
HOST_FLAGS = cpu_flags()


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma avx512f\n\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2", "fma", "avx512f"}
    assert cpu_flags(tmp_path / "missing") == set()


def test_pins_avx2_where_the_cpu_has_it() -> None:
    environ: dict[str, str] = {}
    assert pin_cpu_kernels(environ, {"avx2", "fma", "avx512f"}) == "avx2"
    assert environ == {KERNEL_VARIABLE: "avx2"}


def test_leaves_cpus_without_avx2_and_user_choices_alone() -> None:
    environ: dict[str, str] = {}
    assert pin_cpu_kernels(environ, {"avx", "sse2"}) is None  # older x86, or ARM
    assert environ == {}
    environ = {KERNEL_VARIABLE: "default"}
    assert pin_cpu_kernels(environ, {"avx2", "fma"}) == "default"
    assert environ == {KERNEL_VARIABLE: "default"}
    environ = {OPT_OUT_VARIABLE: "native"}
    assert pin_cpu_kernels(environ, {"avx2", "fma"}) is None
    assert KERNEL_VARIABLE not in environ


def _stage_capability(code: str = "print(torch.backends.cpu.get_cpu_capability())", **overrides: str) -> str:
    """The kernel level torch uses in a process that starts the way a DVC stage does (or what
    `code` prints there, after `import stages, torch`)."""
    env = {k: v for k, v in os.environ.items() if k not in (KERNEL_VARIABLE, OPT_OUT_VARIABLE)}
    env.update(overrides)
    code = f"import stages, torch; {code}"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not {"avx2", "fma"} <= HOST_FLAGS, reason="needs an x86 CPU with AVX2 and FMA")
def test_a_stage_process_runs_avx2_kernels() -> None:
    assert _stage_capability() == "AVX2"


@pytest.mark.skipif("avx512f" not in HOST_FLAGS, reason="needs an AVX-512 CPU to show the opt-out")
def test_opting_out_keeps_the_native_kernels() -> None:
    assert _stage_capability(**{OPT_OUT_VARIABLE: "native"}).startswith("AVX512")


def test_the_machine_description_names_vendor_model_and_kernels(tmp_path: Path) -> None:
    """What a training stage's metrics file records: MKL picks its kernels by CPU vendor, so the
    vendor is what tells two runs' weights apart; the kernels are those the variable pins."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t: avx2 fma\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n",
        encoding="utf-8",
    )
    machine = machine_description({KERNEL_VARIABLE: "avx2"}, cpuinfo)
    assert machine["cpu_vendor"] == "AuthenticAMD" and machine["cpu_model"] == "AMD EPYC 7B13"
    assert machine["cpu_kernels"] == "avx2" and machine["torch"]
    unread = machine_description({}, tmp_path / "missing")
    assert (unread["cpu_vendor"], unread["cpu_model"], unread["cpu_kernels"]) == (None, None, "native")


def test_the_stage_metrics_record_the_kernels_torch_runs_not_the_variable() -> None:
    """ATen ignores a value it does not know (`AVX2`: names are lower case) and runs the CPU's own
    level, AVX-512 where the CPU has it; the metrics recorded the ignored `AVX2` all the same."""
    code = (
        "from selfcest.determinism import machine_description; "
        "print(torch.backends.cpu.get_cpu_capability(), machine_description()['cpu_kernels'])"
    )
    for overrides in ({KERNEL_VARIABLE: "AVX2"}, {KERNEL_VARIABLE: ""}, {}):
        running, recorded = _stage_capability(code, **overrides).split()
        assert recorded == running.lower(), overrides
    assert pin_cpu_kernels({KERNEL_VARIABLE: ""}, {"avx2", "fma"}) is None  # empty: nothing pinned
