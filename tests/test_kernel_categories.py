"""Kernel classes and categories against a labelled list (DESIGN §2): tests/data/kernel_labels.csv holds the
kernels that hold most of the device time on every corpus trace, labelled by reading their names, written
apart from the rules (tests/data/kernel_labels_README.md says how they were chosen). Every one of them
must land where the list says."""

from __future__ import annotations

import csv
import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import CORPUS, corpus_files
from traceq.report.selection import relation
from traceq.store.warehouse import connect

LABELS_CSV = Path(__file__).parent / "data" / "kernel_labels.csv"


def labels(context: str = "") -> dict[str, dict[str, str]]:
    """name -> its label where launched in ``context``: "" (by its name: outside any optimizer step, or
    without a launch) or "optimizer step" (launched inside one: DESIGN §2, context before name)."""
    with open(LABELS_CSV, newline="", encoding="utf-8") as f:
        return {row["name"]: row for row in csv.DictReader(f) if row["context"] == context}


def top_kernels(path: Path) -> list[str]:
    """The names the labelled list must hold for ``path`` (kernel_labels_README.md, "How the names were
    selected"): by total duration, the fewest covering 90 % of the kernel time, at least 15, at most 40."""
    raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    doc = json.loads(raw)
    events = doc if isinstance(doc, list) else doc.get("traceEvents", [])
    total: dict[str, float] = defaultdict(float)
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel"):
            total[e.get("name", "")] += float(e.get("dur") or 0)
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))
    whole, covered, k = sum(total.values()), 0.0, 0
    for name, dur in ranked:
        if covered >= 0.9 * whole:
            break
        covered += dur
        k += 1
    return [name for name, _ in ranked[: min(max(k, min(15, len(ranked))), 40)]]


@pytest.mark.slow
@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: str(p.relative_to(CORPUS)))
def test_the_labelled_list_covers_the_top_kernels_of_every_corpus_trace(path: Path) -> None:
    missing = [name for name in top_kernels(path) if name not in labels()]
    assert not missing, f"label these in {LABELS_CSV.name} (by reading the names): {missing}"


@pytest.mark.slow
def test_every_labelled_kernel_gets_its_class_and_category(corpus_db: Path) -> None:
    """Each kernel of a labelled name gets the label of its context: its name's, or, launched inside an
    optimizer step, that context's (optimizer; a comm kernel stays comm). Names the corpus lacks (MTIA
    ops, ROCm fills) are classified by the rules alone."""
    with connect(corpus_db, read_only=True) as con:
        gpu_classified = relation(con, "gpu_classified")  # noqa: F841 (the SQL reads it by name)
        got: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for name, cls, category in con.sql(
                "select distinct name, class, category from gpu_classified where kind = 1").fetchall():
            got[name].add((cls, "comm" if cls == "comm" else category))
        for name in labels():
            if name not in got:
                rule = con.execute("select class, category from kernel_rules where regexp_matches(?, pattern) "
                                   "order by priority, source = 'builtin' limit 1", [name]).fetchall()
                got[name].add(rule[0] if rule else ("compute", "other"))
    in_step = labels("optimizer step")
    wrong = []
    for name, row in labels().items():
        allowed = {(row["class"], row["category"])}
        if name in in_step:
            allowed.add((in_step[name]["class"], in_step[name]["category"]))
        for have in sorted(got[name] - allowed):
            wrong.append(f"{name[:100]}: rules say {have}, the list {sorted(allowed)} ({row['why']})")
    assert not wrong, "\n".join(wrong)
    assert len(labels()) >= 250
    assert set(in_step) <= set(labels())
    assert {(r["class"], r["category"]) for r in in_step.values()} == {("compute", "optimizer"), ("comm", "comm")}


@pytest.mark.parametrize(("name", "category"), [
    # a pattern must not match inside another word: `lamb` in `lambda`, `gemm` in `fbgemm`
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>(...)::{lambda(float)#1}>", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, lambda>>>", "reduction"),
    ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, lambda>", "elementwise"),
    ("void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>(float const*)", "elementwise"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float>", "optimizer"),
    ("void lamb_stage1_kernel<float>(float*)", "optimizer"),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<3>, LerpFunctor<float>>", "elementwise"),
    # new library kernels in their family
    ("nvjet_sm100_tst_128x256_64x4_2x1_v_bz_TNT", "gemm"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*)", "norm"),
    ("void split_embedding_codegen_forward_unweighted_kernel<float, float, float, long, 2ul>", "embedding"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3", "norm"),
    ("triton_poi_fused_mul_silu_4", "elementwise"),
    ("triton_red_fused_sum_7", "reduction"),
    ("triton_tem_fused_mm_0", "gemm"),
])
def test_categories_of_names_seen_elsewhere(tmp_path: Path, name: str, category: str) -> None:
    with connect(tmp_path / "w.duckdb") as con:
        found = con.execute(
            "select category from kernel_rules where regexp_matches(?, pattern) order by priority, source = 'builtin' limit 1",
            [name],
        ).fetchall()
    assert found == [(category,)], name
