"""NCCL's algorithm and protocol, as far as a collective kernel's name shows them.

NCCL names its kernels after the function they are specialised for:
``ncclKernel_<Coll>_<ALGO>_<PROTO>_<RedOp>_<type>`` up to NCCL 2.18 (``ncclKernel_AllReduce_RING_LL_Sum_float``)
and ``ncclDevKernel_<Coll>[_<RedOp>_<type>]_<ALGO>_<PROTO>`` from 2.19 (``ncclDevKernel_AllGather_RING_LL``,
``ncclDevKernel_AllReduce_Sum_f32_TREE_LL``), besides ``ncclDevKernel_Generic`` and the point-to-point
``..._SendRecv...``. Algorithms: TREE, RING, COLLNET (2.12), COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE,
PAT; protocols: LL, LL128, SIMPLE.

The name is the kernel NCCL launched, and NCCL does not build a kernel for every (algorithm, protocol):
a kernel runs its own function when the work is that function and any other through a table. So what a
name says and what ran differ, and :func:`algorithm_protocol` keeps only what the name establishes
(read in NVIDIA/nccl's source):

- up to 2.18 (``src/collectives/device/common.h``, ``src/enqueue.cc``: "only generate inline kernels for
  LL"), each algorithm has one kernel, its ``_LL`` one, launched for LL, LL128 and Simple alike: the name
  carries the algorithm, never the protocol;
- from 2.19 (``src/device/generate.py``, ``best_kernel``), AllGather and Broadcast launch their
  ``RING_LL`` kernel whatever the algorithm, and the reductions their ``TREE_LL`` kernel for Tree and
  ``RING_LL`` for every other algorithm (Ring, NVLS, CollNet, PAT): the name carries Tree or nothing;
- a name with another algorithm or protocol than those stand-ins comes from a build whose kernels are
  named exactly (each function its own kernel): it is taken as it is;
- ``ncclDevKernel_Generic`` (NCCL 2.19+ and RCCL) and SendRecv (point to point: no algorithm; up to 2.18
  also the kernel of mixed work) carry neither.

One launch may carry several collectives (a group): its kernel is named after one of them (the first
whose kernel is specialised for it), and the others run through the table.

NCCL says what it chose when asked: ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING`` logs each collective's
algorithm and protocol on rank 0; ``NCCL_ALGO`` and ``NCCL_PROTO`` set them. Pure Python, standard library
only (a leaf: reports and findings import it).
"""

from __future__ import annotations

ALGORITHMS = ("TREE", "RING", "COLLNET", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOCOLS = ("LL", "LL128", "SIMPLE")
# the kernels NCCL launches for every protocol (and, from 2.19, for every algorithm but Tree)
_STAND_INS = {("RING", "LL"), ("TREE", "LL")}
_PREFIXES = ("ncclKernel", "ncclDevKernel")
NOTE = (
    "nccl_algo, nccl_proto: NCCL's algorithm and protocol where the kernel's name shows them, else empty. "
    "NCCL launches its _LL kernel for the LL128 and Simple protocols too, so a name's LL is no protocol; "
    "ncclKernel_ names (NCCL <= 2.18) carry the algorithm, ncclDevKernel_ names (2.19+) only TREE (their RING "
    "kernel also runs NVLS, CollNet and PAT), ncclDevKernel_Generic (NCCL 2.19+, RCCL) and SendRecv nothing. "
    "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING logs each collective's algorithm and protocol (rank 0); "
    "NCCL_ALGO and NCCL_PROTO set them"
)


def named_algorithm_protocol(kernel_name: str) -> tuple[str | None, str | None]:
    """The (algorithm, protocol) written in an NCCL kernel's name, the function the kernel is specialised
    for: ``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` gives ("RING", "LL"); (None, None) for a name
    that carries none (``ncclDevKernel_Generic``, ``ncclDevKernel_SendRecv``, RCCL's, gloo's, any other).
    Not what ran: :func:`algorithm_protocol` is."""
    parts = _parts(kernel_name)
    if parts is None:
        return None, None
    _, _, algo, proto = parts
    return algo, proto


def algorithm_protocol(kernel_name: str) -> tuple[str | None, str | None]:
    """The (algorithm, protocol) NCCL ran, as far as the kernel's name ``kernel_name`` establishes them
    (the module's docstring: which NCCL builds name what), each None where it does not:
    ``ncclKernel_AllReduce_RING_LL_Sum_float`` gives ("RING", None), ``ncclDevKernel_AllReduce_Sum_f32_TREE_LL``
    ("TREE", None), ``ncclDevKernel_AllGather_RING_LL`` (None, None), an exactly named
    ``ncclDevKernel_AllReduce_Sum_bf16_NVLS_SIMPLE`` ("NVLS", "SIMPLE"); ``ncclDevKernel_Generic``, RCCL's,
    gloo's and any other name (None, None)."""
    parts = _parts(kernel_name)
    if parts is None:
        return None, None
    prefix, coll, algo, proto = parts
    if coll == "SendRecv":
        return None, None
    if prefix == "ncclKernel":  # up to 2.18: the algorithm's own kernel, the _LL one for every protocol
        return algo, (None if proto == "LL" else proto)
    if (algo, proto) in _STAND_INS:  # 2.19+: TREE_LL for Tree, RING_LL for every other algorithm
        return ("TREE" if algo == "TREE" else None), None
    return algo, proto  # no stand-in has this name: the build names its kernels exactly


def _parts(kernel_name: str) -> tuple[str, str, str, str] | None:
    """(prefix, collective, algorithm, protocol) of an NCCL kernel name that carries an algorithm and a
    protocol, else None. The parameter list and a ``void`` return type are not part of the name."""
    stem = kernel_name.strip().removeprefix("void ").split("(", 1)[0].strip()
    words = stem.split("_")
    if len(words) < 4 or words[0] not in _PREFIXES:
        return None
    for i in range(2, len(words)):
        if words[i] not in PROTOCOLS:
            continue
        # the longest algorithm ending before the protocol: NVLS_TREE rather than TREE
        for start in (i - 2, i - 1):
            algo = "_".join(words[start:i])
            if start >= 2 and algo in ALGORITHMS:
                return words[0], words[1], algo, words[i]
    return None
