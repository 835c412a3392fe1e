"""Short kernel names (DESIGN §2 "Short names"): the rule on names written out from real traces, then on
the top kernels of every corpus run, and the tables that show them (terminal short, CSV/JSON/HTML whole)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from traceq.cli import app
from traceq.kernel_names import WIDTH, short_name, short_names
from traceq.report.kernels import kernel_report
from traceq.report.result import Report, html_table
from traceq.report.selection import StepSelection

ALL = StepSelection(skip_steps=0, include_last=True, drop_incomplete=False)

MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
       "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor"
       "<float, float, float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)")
SILU = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::"
        "TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#6}::operator()() const::{lambda(c10::BFloat16)"
        "#1}, std::array<char*, 2ul> >(int, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::"
        "{lambda()#1}::operator()() const::{lambda()#6}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)")
COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda"
        "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::"
        "BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}"
        "::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>"
        "(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
        "{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::"
        "TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
        "const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1})")
SUM = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::"
       "sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, "
       "4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::"
       "operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)")
ADAMW_LERP = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
              "TensorListMetadata<2>, at::native::(anonymous namespace)::TernaryOpScalarFunctor<c10::BFloat16, 2, 2, 0>, "
              "at::native::LerpFunctor<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::"
              "(anonymous namespace)::TernaryOpScalarFunctor<c10::BFloat16, 2, 2, 0>, at::native::LerpFunctor<float>, float)")
CUTLASS = ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128"
           "_32x3_nn_align4::Params)")
FLASH = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
         "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, "
         "false, false, false, true, false>(pytorch_flash::Flash_fwd_params)")
FLASH3_BWD = ("void cutlass::device_kernel<flash::FlashAttnBwd<flash::CollectiveMainloopBwd<2, cute::tuple<cute::C<1>, "
              "cute::C<1>, cute::C<1> >, cute::tuple<cute::C<64>, cute::C<128>, cute::C<192> >, cutlass::bfloat16_t, float, "
              "cutlass::arch::Sm90, true, false>, flash::CollectiveEpilogueBwd<cute::tuple<cute::C<64> >, cutlass::bfloat16_t, "
              "cutlass::arch::Sm90, 256, true>, flash::SingleTileScheduler> >(flash::FlashAttnBwd<...>::Params)")
ENABLE_IF = ("std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm"
             "_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, c10::BFloat16 const*, float, int, int)")
DEEPEP = ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, dpsk::ep::internode::"
          "SourceMeta*, int4 const*, float const*, long const*, float const*, int*, int*, int*, int*, int const*, int)")
CK_MANGLED = ("_ZN2ck16tensor_operation6device12_GLOBAL__N_149kernel_grouped_conv_fwd_multiple_abd_xdl_cshuffleINS_34"
              "GridwiseGemmMultipleD_xdl_cshuffleItttftNS_5TupleIJEEEtNS0_12element_wise11PassThroughES8_S8_LNS_25"
              "InMemoryDataOperationEnumE0ELi1ELi256ELi128ELi64ELi32ELi8ELi8ELi32ELi32ELi2ELi1ENS_8SequenceIJ")
TENSILE = ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_"
           "DTLA0_DTLB0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMBSK_GLS0_ISA942_IU1_K1_LDSTI0_LBSPPA{}_LBSPPB256_"
           "LBSPPM0_LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV0_MIWT8_6_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS16_NLCA1_NLCB1_ONLL1")


@pytest.mark.parametrize(("name", "short"), [
    # elementwise kernels told apart by their functor or op
    (MUL, "vectorized_elementwise_kernel<BinaryFunctor<MulFunctor>>"),
    (SILU, "vectorized_elementwise_kernel<silu_kernel>"),
    (COPY, "elementwise_kernel<direct_copy_kernel_cuda>"),
    (SUM, "reduce_kernel<sum_functor>"),
    (ADAMW_LERP, "multi_tensor_apply_kernel<TernaryOpScalar, Lerp>"),  # 'Functor' dropped to fit 60
    # GEMMs: a wrapper kernel is the kernel it wraps; cuBLAS nvjet names are short already
    (CUTLASS, "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT"),
    # attention
    (FLASH, "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>"),
    (FLASH3_BWD, "FlashAttnBwd<CollectiveMainloopBwd, CollectiveEpilogueBwd>"),
    # communication: NCCL names kept readable, their parameter list gone
    ("ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_AllGather_RING_LL"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "ncclKernel_AllReduce_RING_LL_Sum_float"),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernel_Generic"),
    (DEEPEP, "dpsk::ep::internode::dispatch"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long)",
     "multimem_all_reduce_kernel"),
    # a return type that is not void
    (ENABLE_IF, "vllm::fused_add_rms_norm_kernel"),
    # ROCm / MIOpen / Triton / copies: short already, unchanged (a space before '(' is no parameter list)
    ("MIOpenBatchNormFwdTrainSpatial", "MIOpenBatchNormFwdTrainSpatial"),
    ("miopenSp3AsmConv_v30_3_1_gfx9_fp16_dot2_edc_f2x3_stride1", "miopenSp3AsmConv_v30_3_1_gfx9_fp16_dot2_edc_f2x3_stride1"),
    ("triton_poi_fused__unsafe_view_mul_silu_2", "triton_poi_fused__unsafe_view_mul_silu_2"),
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
    ("at::cuda::(anonymous namespace)::spin_kernel(long)", "spin_kernel"),
    # a mangled composable-kernel name: read for its kernel and first template argument, then cut
    (CK_MANGLED, "kernel_grouped_conv_fwd_multipl…<GridwiseGemmMultipleD_xdl…>"),
    # a ROCm Tensile GEMM: cut at the end only
    (TENSILE.format(1024), TENSILE[:WIDTH - 1] + "…"),
])
def test_short_names_say_what_the_kernel_is(name: str, short: str) -> None:
    assert short_name(name) == short
    assert len(short_name(name)) <= WIDTH


def test_a_name_of_thousands_of_characters_is_cut_to_the_width() -> None:
    huge = "void at::native::foo_kernel<" + ", ".join(f"at::native::Functor{i}<float>" for i in range(120)) + ">(int)"
    assert len(huge) > 3000
    assert len(short_name(huge)) <= WIDTH and short_name(huge).startswith("foo_kernel<Functor0")
    plain = "x" * 3000
    assert short_name(plain) == "x" * (WIDTH - 1) + "…"


def test_colliding_short_names_get_the_shortest_distinguishing_suffix() -> None:
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<{}>, std::array<char*, 1ul> >(int)"
    names = [fill.format("int"), fill.format("long"), MUL, fill.format("int")]
    assert short_names(names) == ["vectorized_elementwise_kernel<FillFunctor> [int]",
                                  "vectorized_elementwise_kernel<FillFunctor> [long]",
                                  "vectorized_elementwise_kernel<BinaryFunctor<MulFunctor>>",
                                  "vectorized_elementwise_kernel<FillFunctor> [int]"]  # one full name, one short name
    # cut names alike in their first 60 characters: told apart by where they differ, still in the width
    tensile = short_names([TENSILE.format(1024), TENSILE.format(512)])
    assert tensile[0].endswith("[LBSPPA1024]") and tensile[1].endswith("[LBSPPA512]")
    assert all(len(s) <= WIDTH for s in tensile)
    # names differing in punctuation alone are numbered
    assert short_names(["void k<int*>(int)", "void k<int>(int)"]) == ["k", "k #2"]


@pytest.mark.slow
def test_the_top_kernels_of_every_corpus_run_have_short_unique_names(corpus_db: Path) -> None:
    table = kernel_report(corpus_db, top=20, selection=ALL).table
    assert table["run"].n_unique() > 20
    for (run,), rows in table.group_by("run"):
        names = rows["name"].to_list()
        short = short_names(names)
        assert len(set(short)) == len(set(names)), (run, short)
        assert max(len(s) for s in short) <= WIDTH, (run, short)


@pytest.mark.slow
def test_kernels_top_20_fits_a_line_a_row_at_120_columns_on_every_corpus_run(corpus_db: Path) -> None:
    runs = kernel_report(corpus_db, top=1, selection=ALL).table["run"].to_list()
    runner = CliRunner()
    for run in runs:
        out = runner.invoke(app, ["kernels", "--top", "20", "--run", run, "--db", str(corpus_db)], env={"COLUMNS": "120"})
        assert out.exit_code == 0, out.stderr
        full = runner.invoke(app, ["kernels", "--top", "20", "--run", run, "--db", str(corpus_db), "--format", "csv"])
        rows = pl.read_csv(io.StringIO(full.stdout), infer_schema=False)
        lines = out.stdout.splitlines()
        assert len(lines) == 2 + rows.height, (run, out.stdout)  # header, rule, one line a row
        assert max(len(line) for line in lines) <= 120
        shown = [c.strip() for c in lines[0].split("┃")]
        assert {"name", "total_ms", "share_pct"} <= set(shown), (run, shown)
        at = shown.index("name")
        assert [line.split("│")[at].strip() for line in lines[2:]] == short_names(rows["name"].to_list())


@pytest.mark.slow
def test_csv_json_and_full_names_keep_the_whole_name(corpus_db: Path) -> None:
    run = "h100/Qwen_Qwen1.5-0.5B-Chat__1016005"
    whole = kernel_report(corpus_db, top=10, runs=[run]).table["name"].to_list()
    assert any(len(n) > 200 for n in whole)
    runner = CliRunner()
    args = ["kernels", "--top", "10", "--run", run, "--db", str(corpus_db)]
    csv = runner.invoke(app, [*args, "--format", "csv"]).stdout
    assert pl.read_csv(io.StringIO(csv))["name"].to_list() == whole
    assert [r["name"] for r in json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)] == whole
    table = runner.invoke(app, args, env={"COLUMNS": "1000000"}).stdout
    assert whole[1] not in table and short_names(whole)[1] in table
    full = runner.invoke(app, [*args, "--full-names"], env={"COLUMNS": "1000000"}).stdout
    assert all(name in full for name in whole)


def test_html_tables_show_the_short_name_with_the_full_one_on_hover() -> None:
    frame = pl.DataFrame({"name": [MUL, "ampere_sgemm_128x64_tn"], "total_ms": [1.0, 2.0]})
    page = html_table(frame, ("name",))
    assert ">vectorized_elementwise_kernel&lt;BinaryFunctor&lt;MulFunctor&gt;&gt;</td>" in page
    assert 'title="void at::native::vectorized_elementwise_kernel&lt;4' in page
    assert "<td>ampere_sgemm_128x64_tn</td>" in page  # short already: no hover needed
    assert Report(frame, names=("name",)).html().count("title=") == 1
    assert "title=" not in html_table(frame)  # a column not named stays as it is
