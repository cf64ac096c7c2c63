"""The llama.cpp build's variants, their flags and cache keys (edgespec.ops.llama_build)."""
import pytest

from edgespec.ops import llama_build
from edgespec.ops.llama_build import BuildError, Cpu, cmake_args, plan, this_cpu

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse sse2 avx avx2 bmi2 fma f16c avx512f avx512vbmi avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ZEN3 = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse sse2 avx avx2 bmi2 fma f16c\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp\nCPU part\t: 0xd0c\n"


def cpu(text: str, machine: str = "x86_64") -> Cpu:
    parsed = this_cpu(text)
    return Cpu(machine, parsed.model, parsed.flags)


def test_cpuinfo_parsed_for_x86_and_arm():
    spr = this_cpu(SAPPHIRE_RAPIDS)
    assert spr.model.startswith("Intel(R) Xeon(R) Platinum 8481C")
    assert {"amx_tile", "avx512f", "avx2"} <= spr.flags
    arm = this_cpu(GRAVITON)
    assert arm.model == "0xd0c" and "asimddp" in arm.flags


def test_portable_names_the_cpus_instruction_sets_and_never_amx():
    args = cmake_args("portable", cpu(SAPPHIRE_RAPIDS))
    assert "-DGGML_NATIVE=OFF" in args
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX2=ON"} <= set(args)
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)
    assert not [a for a in args if a.startswith("-DGGML_AMX") and a.endswith("=ON")]


def test_portable_turns_off_what_the_cpu_lacks():
    args = cmake_args("portable", cpu(ZEN3))
    assert "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args and "-DGGML_AVX_VNNI=OFF" in args


def test_portable_on_arm_is_the_generic_build():
    args = cmake_args("portable", cpu(GRAVITON, "aarch64"))
    assert args[0] == "-DGGML_NATIVE=OFF" and not [a for a in args if "AVX" in a]


def test_native_key_is_per_cpu_portable_key_per_flags():
    spr, zen = cpu(SAPPHIRE_RAPIDS), cpu(ZEN3)
    assert plan("native", spr, "gcc 12").key != plan("native", zen, "gcc 12").key
    same_flags = Cpu("x86_64", "another model name", spr.flags)
    assert plan("portable", spr, "gcc 12").key == plan("portable", same_flags, "gcc 12").key
    assert plan("native", spr, "gcc 12").key != plan("native", same_flags, "gcc 12").key


def test_key_changes_with_the_compiler_and_the_variant():
    spr = cpu(SAPPHIRE_RAPIDS)
    assert plan("portable", spr, "gcc 12").key != plan("portable", spr, "gcc 13").key
    assert plan("portable", spr, "gcc 12").key != plan("native", spr, "gcc 12").key
    assert plan("native", spr, "gcc 12").wheel_dir.name.startswith("llama-cpp-python-0.3.36-native-")


def test_variant_from_the_environment(monkeypatch):
    monkeypatch.setenv("EDGESPEC_LLAMA_BUILD", "portable")
    assert llama_build.variants() == ["portable"]
    monkeypatch.setenv("EDGESPEC_LLAMA_BUILD", "auto")
    assert llama_build.variants() == ["native", "portable"]
    monkeypatch.setenv("EDGESPEC_LLAMA_BUILD", "fastest")
    with pytest.raises(BuildError, match="EDGESPEC_LLAMA_BUILD='fastest'"):
        llama_build.variants()


def test_bad_variant_in_the_environment_is_one_line_and_exit_1(monkeypatch, capsys):
    monkeypatch.setenv("EDGESPEC_LLAMA_BUILD", "fastest")
    assert llama_build.main(["wheel"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: EDGESPEC_LLAMA_BUILD='fastest'") and err.count("\n") == 1


def test_unknown_variant_refused():
    with pytest.raises(ValueError, match="unknown llama.cpp build variant"):
        cmake_args("fastest", cpu(ZEN3))


def test_exit_described_by_signal_name():
    assert llama_build.describe_exit(-11) == "died by SIGSEGV"
    assert llama_build.describe_exit(-4) == "died by SIGILL"
    assert llama_build.describe_exit(2, "usage\nerror: bad flag\n") == "exited with 2: error: bad flag"
