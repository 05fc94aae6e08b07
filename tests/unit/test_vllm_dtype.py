"""The dtype the real vLLM on CPU runs in: bf16 where AVX-512 has its kernels, else fp32."""

from __future__ import annotations

from pathlib import Path

import pytest

from herdless.launch.vllm import VllmHome, VllmServer, _cpu_dtype

AVX2 = "fpu vme sse sse2 ssse3 fma avx avx2 bmi1 bmi2"


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        (AVX2, "float32"),
        (AVX2 + " avx512f avx512dq avx512bw", "bfloat16"),
        (AVX2 + " avx512f avx512_bf16 amx_bf16", "bfloat16"),
        (AVX2 + " avx512_vnni", "float32"),  # no avx512f: the flag alone does not count
    ],
)
def test_bf16_only_with_avx512(tmp_path: Path, flags: str, dtype: str) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert _cpu_dtype(cpuinfo) == dtype


@pytest.mark.parametrize("text", [None, "processor\t: 0\n"], ids=["unreadable", "no flags"])
def test_bf16_where_the_flags_cannot_be_read(tmp_path: Path, text: str | None) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    if text is not None:
        cpuinfo.write_text(text)
    assert _cpu_dtype(cpuinfo) == "bfloat16"


def test_the_server_runs_in_that_dtype(tmp_path: Path) -> None:
    home = VllmHome(root=tmp_path, python=tmp_path / "python", model=tmp_path / "model")
    command = VllmServer(home, port=8000).command()
    assert command[command.index("--dtype") + 1] == _cpu_dtype()
