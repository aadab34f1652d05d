"""Launchers for the flash kernels, registered as ``torch.library`` ops with autograd.

``vit_flash::fwd(q, k, v, softmax_scale) -> (out, lse)`` and
``vit_flash::bwd(do, q, k, v, out, lse, softmax_scale) -> (dq, dk, dv)``, and their packed twins
``vit_flash::fwd_qkvpacked(qkv, softmax_scale) -> (out, lse)`` and
``vit_flash::bwd_qkvpacked(do, qkv, out, lse, softmax_scale) -> dqkv`` (qkv and dqkv
``(B, N, 3, H, d)``, as the ViT's fused projection makes them). All but ``bwd_qkvpacked`` are
``triton_op``s whose kernels are launched through ``wrap_triton``: ``torch.compile(fullgraph=True)``
traces into them (fake tensors give the output shapes) with no graph break, and Inductor launches
the kernels itself. ``bwd_qkvpacked`` is an opaque ``custom_op`` (why: at its registration); compile
calls it as one extern kernel, also with no graph break. Under ``TRITON_INTERPRET=1`` all four are
opaque ``custom_op``s with fake implementations (compile still has no graph break; the op runs
eagerly inside the graph). Autograd is registered on the forward ops and saves ``q, k, v`` (or
``qkv``), ``out`` and ``lse`` only. Where the C++ launcher loads (:mod:`kernels.flash.native`), the packed forward's
autograd formula calls ``vit_flash_native::bwd_qkvpacked`` instead of ``bwd_qkvpacked``: the same kernels, and a
compiled graph's backward reaches them through the dispatcher with no Python in between (defined below).
Eager calls skip the ops: the C++ path of :mod:`kernels.flash.native`, or here :class:`EagerAttention` and
:class:`EagerAttentionQKVPacked`, which run the same kernels under a ``torch.autograd.Function`` (why: at
their definition). Inputs are assumed valid here; the checks live in :mod:`kernels.flash`.
"""
from __future__ import annotations

import inspect
import sys

import torch
import triton
from torch.autograd.function import once_differentiable
from torch.library import triton_op, wrap_triton
from triton.runtime.autotuner import Autotuner

from .. import split_qkv
from . import configs
from .kernels import LOG2E, flash_bwd_preprocess_kernel
from .launch import Launcher, signature

_ANNOUNCED: set = set()


def _announce(tuner, what, q, tuned_before: int) -> None:
    """Print the tuning time the first time a key is tuned (eager only)."""
    if torch.compiler.is_compiling() or len(tuner.cache) == tuned_before:
        return
    key = (what, q.shape[-1], q.dtype, configs.n_bucket(q.shape[-2]))
    if key not in _ANNOUNCED:
        _ANNOUNCED.add(key)
        print(f"[flash] tuned {what} for head_dim={key[1]}, {key[2]}, N bucket {key[3]} in "
              f"{getattr(tuner, 'bench_time', float('nan')):.2f} s: {tuner.best_config}", file=sys.stderr, flush=True)


def _tiles_grid(block: str):
    """``grid((B·H, N), meta)``: one program per (tile of ``meta[block]`` rows, batch·head), 1-D."""
    def grid(extent, meta):
        bh, n = extent
        return (triton.cdiv(n, meta[block]) * bh,)
    return grid


_LAUNCHERS: dict = {}


def _launch(kernel, block, what, q, tensors, floats, ints, meta_fn, direct: bool, flags: tuple = ()) -> None:
    """Launch ``kernel`` (autotuned or plain) with ``(*tensors, *floats, *ints)`` over (B·H, N) tiles of
    ``meta[block]`` rows.

    ``direct=False`` (the ``triton_op`` bodies): through ``wrap_triton``, which a trace (make_fx,
    Inductor) sees into. ``direct=True`` (the eager Functions and the opaque op): the kernel itself,
    through :class:`Launcher`'s cached launch after the first call of a signature. ``flags``: the
    constexprs that shapes and strides do not fix (they enter the cache key). (Called eagerly
    outside a ``triton_op``, ``wrap_triton`` launches go through a higher-order-op dispatch: the packed
    backward's three launches then cost ~1.8 ms of CPU per call on the H200.)"""
    B, H, N = q.shape[:3]
    args = (*tensors, *floats, *ints)
    tuned = isinstance(kernel, Autotuner)
    tuned_before = len(kernel.cache) if tuned else 0
    if direct and not configs.INTERPRETED:
        launcher = _LAUNCHERS.get(kernel)
        if launcher is None:
            launcher = _LAUNCHERS[kernel] = Launcher(kernel, _tiles_grid(block))
        if launcher(signature(q.shape, tensors, ints + flags), (B * H, N), args, meta_fn):
            return
    else:
        grid = _tiles_grid(block)
        (kernel if direct else wrap_triton(kernel))[lambda m: grid((B * H, N), m)](*args, **meta_fn())
    if tuned:
        _announce(kernel, what, q, tuned_before)


def _meta(q):
    d = q.shape[-1]
    return {"HEAD_DIM": d, "HEAD_DIM_PADDED": configs.head_dim_padded(d), "IEEE": q.dtype == torch.float32}


# Each kernel's constexprs of one launch, from q and the launch's flags (the constexprs that shapes and strides do not
# fix): what launch_fwd / launch_dq / launch_dkdv pass, and what the C++ path's first launches pass (kernels.flash.native).
def _fwd_meta(q, flags) -> dict:  # flags: (STORE_RES, UNSCALED_MAX)
    return {**_meta(q), "STORE_RES": bool(flags[0]), "UNSCALED_MAX": bool(flags[1])}


def _dq_meta(q, flags) -> dict:  # flags: (ADD_RES,)
    return {**_meta(q), "ADD_RES": bool(flags[0])}


def _dkdv_meta(q, flags) -> dict:  # flags: (SPLIT_DS,)
    return {**_meta(q), "SPLIT_DS": bool(flags[0])}


def launch_fwd(tuner, q, k, v, out, lse, softmax_scale, direct=False, res=None, unscaled=False):
    """Run the forward kernel through ``tuner`` (an autotuned flash_fwd_kernel), writing out, lse
    (and ``res``, out's rounding residual, when given: laid out as out). ``unscaled`` (always with ``res``):
    the kernel's UNSCALED_MAX form, fp32_delta's; the FMA form elsewhere (flash_fwd_kernel's docstring says why)."""
    N = q.shape[2]
    store_res = res is not None
    unscaled = unscaled or store_res
    _launch(tuner, "BLOCK_M", "fwd", q, (q, k, v, out, lse, res if store_res else out), (softmax_scale * LOG2E,),
            (*q.stride(), *k.stride(), *v.stride(), *out.stride(), q.shape[1], N, configs.n_bucket(N)),
            lambda: _fwd_meta(q, (store_res, unscaled)), direct, (store_res, unscaled))


def launch_preprocess(out, do, delta, direct=False, res=None):
    """delta = rowsum(dO ∘ (out + res)) alone, for the Hopper kernels (the backward's dQ kernel forms it itself)."""
    d = out.shape[-1]
    add_res = res is not None
    _launch(flash_bwd_preprocess_kernel, "BLOCK_M", "bwd preprocess", out,
            (out, do, res if add_res else out, delta), (), (*out.stride(), *do.stride(), out.shape[1], out.shape[2]),
            lambda: {"HEAD_DIM": d, "HEAD_DIM_PADDED": configs.head_dim_padded(d), "ADD_RES": add_res,
                     "BLOCK_M": configs.PREPROCESS_BLOCK_M}, direct, (add_res,))


def launch_dkdv(tuner, q, k, v, do, dk, dv, lse, delta, softmax_scale, direct=False, split_ds=False):
    """Run the dK/dV kernel; ``split_ds`` (fp32_delta's): dSᵀ Q as two products (kernels._ds_dot)."""
    N = q.shape[2]
    _launch(tuner, "BLOCK_N1", "bwd dk/dv", q, (q, k, v, do, dk, dv, lse, delta),
            (softmax_scale, softmax_scale * LOG2E),
            (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
             q.shape[1], N, configs.n_bucket(N)), lambda: _dkdv_meta(q, (split_ds,)), direct, (split_ds,))


def launch_dq(tuner, q, k, v, do, dq, out, lse, delta, softmax_scale, direct=False, res=None):
    """Run the dQ kernel, which also writes ``delta`` = rowsum(dO ∘ (out + res)) for the dK/dV kernel."""
    N = q.shape[2]
    add_res = res is not None
    _launch(tuner, "BLOCK_M2", "bwd dq", q, (q, k, v, do, dq, out, res if add_res else out, lse, delta),
            (softmax_scale, softmax_scale * LOG2E),
            (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), *out.stride(),
             q.shape[1], N, configs.n_bucket(N)), lambda: _dq_meta(q, (add_res,)), direct, (add_res,))


def _empty_out(q: torch.Tensor) -> torch.Tensor:
    """``(B, H, N, d)`` laid out as ``(B, N, H, d)`` in memory, as SDPA does: the caller's
    ``out.transpose(1, 2).reshape(B, N, H·d)`` is then a view, not a copy. In the ViT that saves one
    (B, N, D) activation per block (H200, ViT-B/16, batch 256: 18.57 GiB peak with a contiguous
    out against 17.70 GiB for SDPA)."""
    B, H, N, d = q.shape
    return torch.empty((B, N, H, d), dtype=q.dtype, device=q.device).transpose(1, 2)


def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
         direct: bool = False, res: torch.Tensor | None = None, unscaled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, N, d = q.shape
    out = _empty_out(q)  # (B, H, N, d)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)  # (B, H, N), natural log
    launch_fwd(configs.FWD[configs.head_dim_class(d)], q, k, v, out, lse, softmax_scale, direct, res, unscaled)
    return out, lse


def _bwd_into(do, q, k, v, out, lse, softmax_scale, dq, dk, dv, direct: bool = False, res=None) -> None:
    """Write dq, dk, dv (preallocated, any strides) for one backward pass: the dQ kernel first, which
    also writes delta, then the dK/dV kernel."""
    B, H, N, d = q.shape
    delta = torch.empty((B, H, N), dtype=torch.float32, device=q.device)  # rowsum(dO ∘ O)
    cls = configs.head_dim_class(d)
    launch_dq(configs.DQ[cls], q, k, v, do, dq, out, lse, delta, softmax_scale, direct, res)
    launch_dkdv(configs.DKDV[cls], q, k, v, do, dk, dv, lse, delta, softmax_scale, direct, split_ds=res is not None)


def _bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
         softmax_scale: float, direct: bool = False, res=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))  # (B, H, N, d)
    _bwd_into(do, q, k, v, out, lse, softmax_scale, dq, dk, dv, direct, res)
    return dq, dk, dv


def _fwd_qkvpacked(qkv: torch.Tensor, softmax_scale: float, direct: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd(*split_qkv(qkv), softmax_scale, direct)


def _bwd_qkvpacked(do: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   softmax_scale: float, direct: bool = False, res=None) -> torch.Tensor:
    """The gradient of a packed ``(B, N, 3, H, d)`` qkv, written in place by the dq and dk/dv
    kernels: no stack of three separate gradients follows (it costs a 3·B·N·D copy and buffer)."""
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)  # (B, N, 3, H, d)
    _bwd_into(do, *split_qkv(qkv), out, lse, softmax_scale, *split_qkv(dqkv), direct, res)
    return dqkv


# fp32_delta variants: the forward also returns ``res`` (out's rounding residual, laid out as out) and
# the backward forms delta from out + res, i.e. from the float32 output.
def _fwd_res(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
             direct: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    res = _empty_out(q)  # (B, H, N, d)
    return (*_fwd(q, k, v, softmax_scale, direct, res), res)


def _bwd_res(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, res: torch.Tensor, softmax_scale: float,
             direct: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd(do, q, k, v, out, lse, softmax_scale, direct, res)


def _fwd_qkvpacked_res(qkv: torch.Tensor, softmax_scale: float,
                       direct: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _fwd_res(*split_qkv(qkv), softmax_scale, direct)


def _bwd_qkvpacked_res(do: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, res: torch.Tensor,
                       softmax_scale: float, direct: bool = False) -> torch.Tensor:
    return _bwd_qkvpacked(do, qkv, out, lse, softmax_scale, direct, res)


def _fwd_fake(q, k, v, softmax_scale):
    B, H, N = q.shape[:3]
    return _empty_out(q), q.new_empty((B, H, N), dtype=torch.float32)


def _bwd_fake(do, q, k, v, out, lse, softmax_scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_qkvpacked_fake(qkv, softmax_scale):
    return _fwd_fake(*split_qkv(qkv), softmax_scale)


def _bwd_qkvpacked_fake(do, qkv, out, lse, softmax_scale):
    return qkv.new_empty(qkv.shape)


def _fwd_res_fake(q, k, v, softmax_scale):
    return (*_fwd_fake(q, k, v, softmax_scale), _empty_out(q))


def _bwd_res_fake(do, q, k, v, out, lse, res, softmax_scale):
    return _bwd_fake(do, q, k, v, out, lse, softmax_scale)


def _fwd_qkvpacked_res_fake(qkv, softmax_scale):
    return _fwd_res_fake(*split_qkv(qkv), softmax_scale)


def _bwd_qkvpacked_res_fake(do, qkv, out, lse, res, softmax_scale):
    return qkv.new_empty(qkv.shape)


def _op_signature(fn):
    """``fn`` as the op sees it: its annotated arguments without the defaulted launch options (``direct``, ``res``)."""
    def body(*args):
        return fn(*args)

    sig = inspect.signature(fn)
    body.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.default is p.empty])
    body.__name__ = fn.__name__
    return body


def _register(name, fn, fake, opaque=False):
    """A ``triton_op`` (compile sees the kernels), or an opaque ``custom_op`` with an explicit fake
    implementation: under the interpreter, which ``wrap_triton`` cannot trace, and where ``opaque``.
    An opaque op launches its kernels directly (``direct=True``), as a ``triton_op`` does when it runs eagerly."""
    traced = _op_signature(fn)
    if configs.INTERPRETED or opaque:
        op = torch.library.custom_op(name, lambda *args: fn(*args, direct=True), mutates_args=(),
                                     schema=torch.library.infer_schema(traced, mutates_args=()))
        op.register_fake(fake)
        return op
    return triton_op(name, mutates_args=())(traced)


_fwd_op = _register("vit_flash::fwd", _fwd, _fwd_fake)
_register("vit_flash::bwd", _bwd, _bwd_fake)
_fwd_qkvpacked_op = _register("vit_flash::fwd_qkvpacked", _fwd_qkvpacked, _fwd_qkvpacked_fake)
# Opaque to Inductor: traced, its dk/dv kernel would mutate two views of one buffer, a case that
# PyTorch's own triton_kernel_wrap.py marks as a known functionalization bug.
_register("vit_flash::bwd_qkvpacked", _bwd_qkvpacked, _bwd_qkvpacked_fake, opaque=True)
_fwd_res_op = _register("vit_flash::fwd_fp32_delta", _fwd_res, _fwd_res_fake)
_register("vit_flash::bwd_fp32_delta", _bwd_res, _bwd_res_fake)
_fwd_qkvpacked_res_op = _register("vit_flash::fwd_qkvpacked_fp32_delta", _fwd_qkvpacked_res, _fwd_qkvpacked_res_fake)
_register("vit_flash::bwd_qkvpacked_fp32_delta", _bwd_qkvpacked_res, _bwd_qkvpacked_res_fake, opaque=True)


def _setup_context(ctx, inputs, output):
    """For the forward ops: inputs are ``(q, k, v, softmax_scale)`` or ``(qkv, softmax_scale)``;
    outputs ``(out, lse)`` or ``(out, lse, res)``."""
    *tensors, softmax_scale = inputs
    out, lse, *res = output
    ctx.save_for_backward(*tensors, out, lse, *res)
    ctx.softmax_scale = softmax_scale
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zeros for lse's gradient, which is never used


def _backward(ctx, dout, dlse, *dres):
    # lse (and res) are non-differentiable auxiliary outputs for the backward: their gradients are None.
    q, k, v, out, lse, *res = ctx.saved_tensors
    bwd_op = torch.ops.vit_flash.bwd_fp32_delta if res else torch.ops.vit_flash.bwd
    dq, dk, dv = bwd_op(dout, q, k, v, out, lse, *res, ctx.softmax_scale)
    return dq, dk, dv, None


# vit_flash_native::bwd_qkvpacked(dout, qkv, out, lse, res?, softmax_scale) -> dqkv: the packed backward that the
# packed forward op's autograd formula calls where the C++ launcher loads (kernels/flash/native.py). Its C++ kernel
# (csrc/eager.cpp), registered for the CUDA key when the extension loads, takes precedence over the Python kernel
# defined here for every device. The op is defined here, at import, so that a graph compiled in another process
# (torch.compile's caches) finds it: the Python kernel then loads the extension, or runs the Python launcher.
_NATIVE_LIB = torch.library.Library("vit_flash_native", "DEF")
_NATIVE_LIB.define("bwd_qkvpacked(Tensor dout, Tensor qkv, Tensor out, Tensor lse, Tensor? res, float softmax_scale)"
                   " -> Tensor")


def _native_bwd_qkvpacked(dout, qkv, out, lse, res, softmax_scale):
    from . import native  # (native imports this module)

    eager = native.module()
    if eager is not None:
        return eager.bwd_qkvpacked(dout, qkv, out, lse, res, softmax_scale)
    return _bwd_qkvpacked(dout, qkv, out, lse, softmax_scale, True, res)


_NATIVE_LIB.impl("bwd_qkvpacked", _native_bwd_qkvpacked, "CompositeExplicitAutograd")
torch.library.register_fake("vit_flash_native::bwd_qkvpacked", lib=_NATIVE_LIB)(
    lambda dout, qkv, out, lse, res, softmax_scale: qkv.new_empty(qkv.shape))  # (B, N, 3, H, d), contiguous


def _backward_qkvpacked(ctx, dout, dlse, *dres):
    from . import native

    qkv, out, lse, *res = ctx.saved_tensors
    # Not while a graph of the gradient is recorded (create_graph=True): the op has no autograd kernel (PyTorch's
    # fallback would warn and pass undefined gradients on), where vit_flash::bwd_qkvpacked's second derivative raises.
    if not torch.is_grad_enabled() and native.module() is not None:
        return torch.ops.vit_flash_native.bwd_qkvpacked(dout, qkv, out, lse, res[0] if res else None,
                                                        ctx.softmax_scale), None
    bwd_op = torch.ops.vit_flash.bwd_qkvpacked_fp32_delta if res else torch.ops.vit_flash.bwd_qkvpacked
    return bwd_op(dout, qkv, out, lse, *res, ctx.softmax_scale), None


def _setup_context_res(ctx, inputs, output):
    _setup_context(ctx, inputs, output)
    ctx.mark_non_differentiable(output[1], output[2])


_fwd_op.register_autograd(_backward, setup_context=_setup_context)
_fwd_qkvpacked_op.register_autograd(_backward_qkvpacked, setup_context=_setup_context)
_fwd_res_op.register_autograd(_backward, setup_context=_setup_context_res)
_fwd_qkvpacked_res_op.register_autograd(_backward_qkvpacked, setup_context=_setup_context_res)

fwd = torch.ops.vit_flash.fwd
bwd = torch.ops.vit_flash.bwd
fwd_qkvpacked = torch.ops.vit_flash.fwd_qkvpacked
bwd_qkvpacked = torch.ops.vit_flash.bwd_qkvpacked
fwd_fp32_delta = torch.ops.vit_flash.fwd_fp32_delta
fwd_qkvpacked_fp32_delta = torch.ops.vit_flash.fwd_qkvpacked_fp32_delta


def _eager_fwd(ctx, q, k, v, softmax_scale, fp32_delta, grad_enabled):
    """The forward both eager Functions run: ``(out, saved)``, ``saved`` = ``(out, lse)`` or ``(out, lse, res)``.
    Without a gradient to come (``grad_enabled`` False: the caller's ``torch.is_grad_enabled()``, which is off
    inside ``forward``; or no input that requires grad) fp32_delta's residual is not written; out is the same."""
    keep_res = fp32_delta and grad_enabled and any(ctx.needs_input_grad)
    res = _empty_out(q) if keep_res else None  # (B, H, N, d)
    out, lse = _fwd(q, k, v, softmax_scale, True, res, unscaled=fp32_delta)
    ctx.softmax_scale = softmax_scale
    return out, (out, lse, *([res] if res is not None else []))


class EagerAttention(torch.autograd.Function):
    """``fwd`` and ``bwd``'s kernels for eager calls, with autograd outside ``torch.library``'s dispatch.

    The op path costs CPU time per call that a small-N kernel cannot hide. H200 host, torch 2.11:
    ``torch/_library/custom_ops.py`` ``backend_impl`` alone took 0.19 ms per forward-op call and
    0.43 ms per backward-op call, and an autograd forward+backward through the ops took 1.0-1.25 ms
    of CPU at (256, 12, 197, 64), where the kernels need 0.68 ms of GPU
    (benchmarks/results/launch_overhead_profile_h200.log). ``torch.compile`` still traces the ops.
    ``apply(q, k, v, softmax_scale, fp32_delta, grad_enabled) -> out``, shapes as ``fwd``; bitwise equal to the
    op path.
    """

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, fp32_delta=False, grad_enabled=True):
        out, saved = _eager_fwd(ctx, q, k, v, softmax_scale, fp32_delta, grad_enabled)
        ctx.save_for_backward(q, k, v, *saved)
        return out  # (B, H, N, d)

    @staticmethod
    @once_differentiable  # the kernels' gradients are not themselves differentiable: fail, not wrong
    def backward(ctx, do):
        q, k, v, out, lse, *res = ctx.saved_tensors
        dq, dk, dv = _bwd(do, q, k, v, out, lse, ctx.softmax_scale, True, *res)
        return dq, dk, dv, None, None, None


class EagerAttentionQKVPacked(torch.autograd.Function):
    """:class:`EagerAttention` for a packed ``(B, N, 3, H, d)`` qkv: ``fwd_qkvpacked`` and
    ``bwd_qkvpacked``'s kernels. ``apply(qkv, softmax_scale, fp32_delta, grad_enabled) -> out`` (B, H, N, d)."""

    @staticmethod
    def forward(ctx, qkv, softmax_scale, fp32_delta=False, grad_enabled=True):
        out, saved = _eager_fwd(ctx, *split_qkv(qkv), softmax_scale, fp32_delta, grad_enabled)
        ctx.save_for_backward(qkv, *saved)
        return out  # (B, H, N, d)

    @staticmethod
    @once_differentiable  # the kernels' gradients are not themselves differentiable: fail, not wrong
    def backward(ctx, do):
        qkv, out, lse, *res = ctx.saved_tensors
        dqkv = _bwd_qkvpacked(do, qkv, out, lse, ctx.softmax_scale, True, *res)
        return dqkv, None, None, None  # (B, N, 3, H, d)
