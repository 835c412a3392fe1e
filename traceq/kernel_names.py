"""Short kernel names for terminal tables: what a kernel is, in at most
:data:`WIDTH` characters, unique within a table. The full name stays in the data, CSV/JSON and HTML.

The rule, applied in this order to a demangled C++ name (``void at::native::vectorized_elementwise_kernel<4,
at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, ...>(int, ...)``):

1. A name that is a plain word of at most :data:`WIDTH` characters (``ncclDevKernel_AllGather_RING_LL``,
   ``Memcpy HtoD (Pageable -> Device)``, ``triton_poi_fused_add_cos_sin_0``) is kept as it is.
2. The parameter list (the ``(...)`` right after the name, no space before it) and the return type (``void``,
   ``std::enable_if<...>::type``) go; a mangled name (``_ZN2ck...``) is read for its nested name and its first
   template argument.
3. Namespaces every kernel shares go (:data:`SHARED_SCOPES`: ``at::native::``, ``(anonymous namespace)::``,
   ``c10::``, ``std::``, ``cutlass::``, ``cuda::`` ...); others (``flash::``, ``dpsk::ep::internode::``,
   ``vllm::``) stay while they fit.
4. Template arguments keep what tells kernels apart, the functor or op, and lose what does not: numbers,
   booleans, casts, scalar types (float, c10::BFloat16, __nv_bfloat16 ...), pointers, argument containers
   (std::array, TensorListMetadata, OffsetCalculator ...) and the namespaces of the types kept. A lambda
   stands for the function it is written in (``silu_kernel(...)::{lambda()#1}::...`` is ``silu_kernel``), and
   helpers that only wrap the op stand for it (``gpu_kernel_impl_nocast<F>``, ``ReduceOp<F>``,
   ``func_wrapper_t<F>``), as a wrapper kernel stands for the kernel it wraps (``cutlass::Kernel<K>``,
   ``cutlass::device_kernel<K>``). So ``vectorized_elementwise_kernel<BinaryFunctor<MulFunctor>>``,
   ``multi_tensor_apply_kernel<BinaryOpScalarFunctor, multiplies>``, ``reduce_kernel<sum_functor>``.
5. Still longer than :data:`WIDTH`: the first form that fits of: the kernel's own namespaces dropped,
   ``Functor`` dropped from the ops (``elementwise_kernel<Binary<Mul>>``), the ops' own arguments dropped,
   two ops, one op; then the name and the op are cut to share the width, each with an ellipsis (the op
   kept whole where it is short).

Within a table (:func:`short_names`), kernels whose short names would collide get the shortest
distinguishing suffix drawn from their full names: the first words in which they differ (``[int]``,
``[warp]``, ``[LBSPPA512]``), the name cut further to make room; numbered (``#2``) only where the full
names differ in punctuation alone. Pure Python, no import beyond the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

WIDTH = 60  # characters of a short name, at most

# namespace components every kernel shares: they tell nothing apart
SHARED_SCOPES = frozenset({
    "at", "native", "c10", "std", "cuda", "cutlass", "cute", "detail", "(anonymous namespace)", "_GLOBAL__N_1",
    "binary_internal", "templates",
})
# template arguments that never tell kernels apart: scalar types, pointers' pointees, argument containers
_DROPPED = frozenset({
    "float", "double", "int", "long", "short", "char", "bool", "void", "unsigned", "signed", "half", "Half",
    "BFloat16", "__half", "__nv_bfloat16", "__nv_half", "bfloat16_t", "half_t", "tfloat32_t", "float2", "float4",
    "int2", "int4", "uint4", "size_t", "int64_t", "int32_t", "uint32_t", "uint64_t", "int8_t", "uint8_t",
    "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz", "__nv_fp8_e4m3", "__nv_fp8_e5m2",
    "array", "Array", "TensorListMetadata", "TensorListScalarListMetadata", "FusedOptimizerTensorListMetadata",
    "OffsetCalculator", "TrivialOffsetCalculator", "TensorInfo", "GenericPackedTensorAccessor",
    "PackedTensorAccessor32", "PackedTensorAccessor64", "RestrictPtrTraits", "DefaultPtrTraits", "LoadWithoutCast",
    "StoreWithoutCast", "LoadWithCast", "StoreWithCast", "tuple", "C", "Int", "Shape", "Stride", "Layout",
    "Sm70", "Sm75", "Sm80", "Sm86", "Sm89", "Sm90", "Sm100", "OpaqueType", "decltype",
})
# helpers whose arguments are what they stand for
_TRANSPARENT = frozenset({"gpu_kernel_impl", "gpu_kernel_impl_nocast", "ReduceOp", "func_wrapper_t"})
# kernels that only wrap another kernel given as their template argument
_WRAPPERS = frozenset({"Kernel", "Kernel2", "device_kernel"})
_OPEN = {"<": ">", "(": ")", "{": "}", "[": "]"}
_CLOSE = {v: k for k, v in _OPEN.items()}
_WORD = re.compile(r"[A-Za-z0-9]+")
_SUFFIX_WIDTH = 24  # characters of a distinguishing suffix, at most


def short_name(name: str) -> str:
    """``name`` (a kernel's full name) as at most :data:`WIDTH` characters that say what the kernel is
    (the module's docstring has the rule)."""
    name = " ".join(name.split())
    if len(name) <= WIDTH and not any(c in name for c in "<:") and not name.startswith("void ") and not _params_at(name):
        return name
    if name.startswith("_Z"):
        name = _demangled_enough(name)
    func = _function(name)
    if func is None:  # not a C++ signature: cut
        return _cut(name, WIDTH)
    scopes, base, args = func
    if base in _WRAPPERS and args:
        inner = _function(args[0])
        if inner is not None:
            scopes, base, args = inner
    ops = [op for op in (_op(a) for a in args) if op is not None]
    return _fit(scopes, base, ops)


def short_names(names: Sequence[str]) -> list[str]:
    """The short names of ``names`` (a table's column), unique within it: the same full name gets the same
    short name; different ones whose short names collide get the shortest distinguishing suffix drawn from
    their full names (the module's docstring)."""
    distinct = list(dict.fromkeys(names))
    short = {n: short_name(n) for n in distinct}
    groups: dict[str, list[str]] = {}
    for n in distinct:
        groups.setdefault(short[n], []).append(n)
    for s, group in groups.items():
        if len(group) > 1:
            for n, suffix in zip(group, _suffixes(group)):
                if suffix:
                    short[n] = _cut(s, WIDTH - len(suffix) - 1) + " " + suffix
    taken: dict[str, int] = {}
    for n in distinct:  # what is still alike (names differing in punctuation alone) is numbered
        taken[short[n]] = taken.get(short[n], 0) + 1
        if taken[short[n]] > 1:
            mark = f" #{taken[short[n]]}"
            short[n] = _cut(short[n], WIDTH - len(mark)) + mark
    return [short[n] for n in names]


# --------------------------------------------------------------------------------------------------
# reading a name


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` where no bracket is open (``<`` counted only outside parentheses, where
    ``(8)>(0)`` is an expression)."""
    parts, stack, start, i = [], [], 0, 0
    while i < len(text):
        c = text[i]
        if c in _OPEN and not (c == "<" and stack and stack[-1] == "("):
            stack.append(c)
        elif c in _CLOSE and stack and stack[-1] == _CLOSE[c]:
            stack.pop()
        elif not stack and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _params_at(text: str) -> int | None:
    """Where the parameter list of a C++ signature starts in ``text`` (an identifier or ``>`` right before
    its ``(``, no space), or None."""
    stack: list[str] = []
    for i, c in enumerate(text):
        if c in _OPEN and not (c == "<" and stack and stack[-1] == "("):
            if c == "(" and not stack and i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_>") \
                    and _closes_at_end(text, i):
                return i
            stack.append(c)
        elif c in _CLOSE and stack and stack[-1] == _CLOSE[c]:
            stack.pop()
    return None


def _closes_at_end(text: str, start: int) -> bool:
    """Whether the ``(`` at ``start`` closes at the end of ``text`` (a trailing ``const`` aside)."""
    stack = []
    for i in range(start, len(text)):
        c = text[i]
        if c in _OPEN and not (c == "<" and stack and stack[-1] == "("):
            stack.append(c)
        elif c in _CLOSE and stack and stack[-1] == _CLOSE[c]:
            stack.pop()
            if not stack:
                return text[i + 1:].strip() in ("", "const")
    return False


def _function(text: str) -> tuple[list[str], str, list[str]] | None:
    """(namespaces, base name, template arguments) of the function or type ``text`` names, its return
    type and parameter list left out; None where ``text`` is no C++ name."""
    text = text.strip()
    at = _params_at(text)
    if at is not None:
        text = text[:at]
    words = [w for w in _split(text, " ") if w]
    if not words or (len(words) > 1 and at is None and words[0] not in ("void", "struct", "class")):
        return None  # words, not a C++ name
    text = words[-1]
    parts = [p for p in _split(text, "::") if p]
    if not parts:
        return None
    last = parts[-1]
    lt = last.find("<")
    if lt > 0 and last.endswith(">"):
        base, args = last[:lt], [a.strip() for a in _split(last[lt + 1:-1], ",")]
    else:
        base, args = last, []
    if not re.fullmatch(r"[A-Za-z_~][\w~]*", base):
        return None
    return [p for p in parts[:-1] if p not in SHARED_SCOPES], base, args


def _op(arg: str) -> str | None:
    """A template argument as the op it names (its namespaces and dropped arguments left out), or None
    where it tells nothing (a number, a scalar type, a container)."""
    arg = arg.strip()
    if arg.endswith(("*", "&")) or arg.startswith("(") or not re.search(r"[A-Za-z_]", arg):
        return None
    if arg in ("true", "false") or arg.startswith(("unsigned ", "signed ", "const ", "long ")):
        return None
    parts = [p.strip() for p in _split(arg, "::")]
    lambda_at = next((i for i, p in enumerate(parts) if p.startswith("{lambda")), None)
    if lambda_at is not None:  # a lambda: the function it is written in
        parts = parts[:lambda_at]
        if parts and parts[-1].startswith("operator()"):
            parts = parts[:-1]
        if not parts:
            return None
        at = _params_at(parts[-1])
        parts[-1] = parts[-1][:at] if at is not None else parts[-1]
    last = parts[-1].removesuffix(" const").strip()
    lt = last.find("<")
    base, inner = (last[:lt], _split(last[lt + 1:-1], ",")) if lt > 0 and last.endswith(">") else (last, [])
    base = base.strip()
    if base in _DROPPED or not re.fullmatch(r"[A-Za-z_]\w*", base):
        return None
    ops = [op for op in (_op(a) for a in inner) if op is not None]
    if base in _TRANSPARENT:
        return ", ".join(ops) if ops else None
    return f"{base}<{', '.join(ops)}>" if ops else base


def _demangled_enough(name: str) -> str:
    """A mangled (Itanium) name read far enough to name its kernel: the nested name and its first template
    argument's, as ``a::b::kernel<c::op>``; the name as it is where it cannot be read."""

    def nested(i: int) -> tuple[list[str], int]:
        found = []
        while i < len(name):
            if name[i].isdigit():
                m = re.match(r"\d+", name[i:])
                n = int(m.group())
                i += len(m.group())
                found.append(name[i:i + n])
                i += n
            elif name[i] == "S":  # a substitution (S_, S0_ ...): a scope said before
                m = re.match(r"S[0-9A-Z]*_", name[i:])
                if not m:
                    break
                i += len(m.group())
            elif name[i] in "NLK":
                i += 1
            else:
                break
        return found, i

    outer, i = nested(2)
    if not outer:
        return name
    text = "::".join(outer)
    if i < len(name) and name[i] == "I":
        arg, _ = nested(i + 1)
        if arg:
            text += f"<{'::'.join(arg)}>"
    return text


# --------------------------------------------------------------------------------------------------
# fitting it in


def _fit(scopes: list[str], base: str, ops: list[str]) -> str:
    """The first form of the name that fits :data:`WIDTH`, from the richest (module docstring, step 5)."""
    plain = [re.sub(r"Functor\b", "", op) or op for op in ops]
    flat = [op.split("<")[0] for op in plain]
    for args in (ops, plain, flat, flat[:2], flat[:1]):
        for kept in (scopes, []):
            text = "::".join([*kept, base]) + (f"<{', '.join(args)}>" if args else "")
            if len(text) <= WIDTH:
                return text
    if not flat:
        return _cut(base, WIDTH)
    op = flat[0]
    room = WIDTH - 2  # the brackets
    base_room = max(room - len(op), min(len(base), 32))
    cut_base = _cut(base, base_room)
    return f"{cut_base}<{_cut(op, room - len(cut_base))}>"


def _cut(text: str, width: int) -> str:
    """``text`` in ``width`` characters, an ellipsis where it was cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _suffixes(group: Sequence[str]) -> list[str]:
    """For each full name of ``group`` (whose short names collide), the words of it that tell it from the
    others: the first word where it differs from a rival, then the next where it differs from the rivals
    left, and so on, as ``[w1 w2]``; '' where only punctuation differs (numbered by the caller)."""
    words = [[w for w in _WORD.findall(_without_return_type(n)) if w not in SHARED_SCOPES] for n in group]
    out = []
    for k, mine in enumerate(words):
        rivals = [w for j, w in enumerate(words) if j != k]
        picked = []
        for i, word in enumerate(mine):
            if not rivals:
                break
            beaten = [r for r in rivals if i >= len(r) or r[i] != word]
            if beaten:
                picked.append(word)
                rivals = [r for r in rivals if r not in beaten]
        if not picked and rivals and len(mine) < max(len(r) for r in rivals):
            picked.append("…")  # its words are the start of a rival's
        suffix = "[" + " ".join(picked) + "]" if picked else ""
        out.append(suffix if len(suffix) <= _SUFFIX_WIDTH else suffix[: _SUFFIX_WIDTH - 2] + "…]")
    return out


def _without_return_type(name: str) -> str:
    return name[5:] if name.startswith("void ") else name
