"""Every aten op torch can dispatch, classified for :func:`torch_bridge.audit`.

An op (an aten overload packet; an in-place ``op_`` is ``op``) is one of

* **multiply-free** — data movement, additions and subtractions, max/min, selections,
  comparisons, sign and rounding, metadata, sampling: the audit never counts it.  A few
  are free only for some argument values (:data:`CONDITIONAL`: ``add`` with
  ``alpha == 1``, ``scatter_reduce`` with a sum/max/min reduction, ...) or for real
  operands (:data:`COMPLEX_BEARING`: ``sgn`` and ``abs`` of a complex tensor divide and
  take square roots);
* **emulated** — the aten op of a torch function that :func:`torch_bridge.pam_mode`
  routes to a PA version.  Derived from mode.py's own table (:func:`emulated`), not
  listed here.  It is multiply-bearing: when it still reaches aten natively (its op
  group off, operands the mode leaves to torch, a spelling it does not catch) the audit
  counts it;
* **native by design** — a multiply-bearing op left native on purpose, with the reason
  (:data:`NATIVE_BY_DESIGN`; for integer results, :data:`INTEGER_BY_DESIGN`): the audit
  lists it but does not count it as escaped;
* **multiply-bearing** — everything else that multiplies, divides or evaluates a
  function: counted as escaped whenever it runs natively.

Explicit names come first (:data:`NATIVE_BY_DESIGN`, :data:`MULTIPLY_FREE`, the
emulated set, :data:`MULTIPLY_BEARING`), then the rules of :data:`FAMILIES` for ops
that share one (``_foreach_*`` and ``special_*`` follow their base op, ``*_copy`` its
view, backward ops, ``linalg_*``, ``fft_*``, backend kernels, ...).  An op that none of
them names — an op of a newer torch, a custom op of another namespace — is
*unclassified*: the audit counts it as escaped, never as free, and
tests/test_torch_audit.py fails until it is added here.
"""
from __future__ import annotations

import functools
import re

import torch

__all__ = ["FREE", "EMULATED", "BY_DESIGN", "BEARING", "MULTIPLY_FREE", "MULTIPLY_BEARING",
           "NATIVE_BY_DESIGN", "INTEGER_BY_DESIGN", "CONDITIONAL", "COMPLEX_BEARING", "FAMILIES",
           "classify", "emulated", "packet"]

FREE, EMULATED, BY_DESIGN, BEARING = ("multiply-free", "emulated", "native by design",
                                      "multiply-bearing")

#: aten ops that multiply nothing
MULTIPLY_FREE = frozenset("""
    add sub rsub subtract neg negative positive abs absolute sum nansum cumsum diff trace
    max min amax amin aminmax _aminmax maximum minimum fmax fmin clamp clamp_min clamp_max
    clip relu relu6 threshold threshold_backward hardtanh hardtanh_backward hardshrink
    softshrink where masked_fill masked_scatter masked_select heaviside nan_to_num
    nextafter frexp copysign sign sgn signbit floor ceil round trunc fix frac
    eq ne lt le gt ge equal greater greater_equal less less_equal not_equal isnan isinf
    isfinite isneginf isposinf isreal isin logical_not logical_and logical_or logical_xor
    bitwise_not bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift
    __and__ __iand__ __or__ __ior__ __xor__ __ixor__ __lshift__ __ilshift__ __rshift__
    __irshift__ any all _is_all_true _is_any_true count_nonzero nonzero nonzero_numpy
    nonzero_static argwhere argmax argmin sort argsort msort topk kthvalue median nanmedian
    mode cummax cummin _cummax_helper _cummin_helper unique_consecutive unique_dim
    unique_dim_consecutive _unique _unique2 bucketize searchsorted bincount
    copy _copy_from _copy_from_and_resize _to_copy clone _lazy_clone contiguous to type_as
    _cast_Byte _cast_Char _cast_Double _cast_Float _cast_Half _cast_Int _cast_Long
    _cast_Short chalf _autocast_to_full_precision _autocast_to_reduced_precision
    _saturate_weight_to_fp16 _to_cpu _to_dense to_dense to_mkldnn _pin_memory pin_memory
    view _unsafe_view view_as reshape reshape_as _reshape_alias _reshape _reshape_from_tensor
    flatten unflatten ravel expand expand_as broadcast_to broadcast_tensors permute
    transpose t adjoint mT mH matrix_H numpy_T swapaxes swapdims movedim moveaxis squeeze
    unsqueeze atleast_1d atleast_2d atleast_3d alias detach data lift lift_fresh
    select slice narrow diagonal diag diag_embed diagflat index index_select gather take
    take_along_dim split split_with_sizes tensor_split unsafe_split unsafe_split_with_sizes
    chunk unsafe_chunk unbind dsplit hsplit vsplit as_strided unfold unfold_backward
    select_backward slice_backward diagonal_backward index_select_backward gather_backward
    masked_select_backward masked_scatter_backward trace_backward
    value_selecting_reduction_backward cummaxmin_backward as_strided_scatter slice_scatter
    select_scatter diagonal_scatter slice_inverse scatter scatter_add scatter_reduce
    index_add index_reduce index_fill index_put _index_put_impl put _unsafe_index
    _unsafe_index_put _unsafe_masked_index _unsafe_masked_index_put_accumulate
    cat concat concatenate stack _stack _chunk_cat hstack vstack dstack column_stack
    row_stack block_diag cartesian_prod combinations meshgrid flip fliplr flipud rot90 roll
    repeat repeat_interleave tile tril triu constant_pad_nd pad _pad_enum _pad_circular
    reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d
    replication_pad3d reflection_pad1d_backward reflection_pad2d_backward
    reflection_pad3d_backward replication_pad1d_backward replication_pad2d_backward
    replication_pad3d_backward im2col col2im channel_shuffle native_channel_shuffle
    pixel_shuffle pixel_unshuffle one_hot embedding embedding_backward
    embedding_dense_backward embedding_sparse_backward max_pool1d max_pool2d max_pool3d
    max_pool1d_with_indices max_pool2d_with_indices max_pool3d_with_indices
    max_pool2d_backward max_pool2d_with_indices_backward max_pool3d_with_indices_backward
    adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d
    adaptive_max_pool2d_backward adaptive_max_pool3d_backward fractional_max_pool2d_backward
    fractional_max_pool3d_backward max_unpool2d max_unpool3d
    _pack_padded_sequence _pack_padded_sequence_backward _pad_packed_sequence pad_sequence
    _jagged_to_padded_dense_forward _padded_dense_to_jagged_forward to_padded_tensor
    _rowwise_prune _convert_weight_to_int4pack _convert_weight_to_int4pack_for_cpu
    to_dense_backward to_mkldnn_backward
    view_as_real view_as_complex complex real imag conj _conj conj_physical _conj_physical
    resolve_conj resolve_neg _neg_view _fw_primal _make_dual _unpack_dual
    _add_batch_dim _remove_batch_dim _propagate_xla_data _make_dep_token
    empty empty_like empty_strided empty_permuted new_empty new_empty_strided zeros
    zeros_like ones ones_like full full_like new_zeros new_ones new_full scalar_tensor
    _efficientzerotensor _new_zeros_with_same_feature_meta fill fill_diagonal zero eye
    arange range _dim_arange tril_indices triu_indices from_file resize resize_as
    resize_as_sparse _resize_output set set_data _shape_as_tensor _has_compatible_shallow_copy_type
    _has_same_storage_numel _debug_has_internal_overlap _is_zerotensor _local_scalar_dense
    item _version output_nr requires_grad retain_grad retains_grad record_stream
    get_gradients get_device is_coalesced is_complex is_conj is_contiguous is_distributed
    is_floating_point is_inference is_leaf is_neg is_nonzero is_pinned is_same_size
    is_set_to is_signed numel size stride storage_offset dim sym_is_contiguous sym_numel
    sym_size sym_storage_offset sym_stride result_type _fused_sdp_choice
    _use_cudnn_ctc_loss _use_miopen_ctc_loss cudnn_is_acceptable _assert_async
    _assert_tensor_metadata _functional_assert_async _functional_assert_scalar
    _functional_sym_constrain_range _functional_sym_constrain_range_for_size hash_tensor
    _coalesce _coalesced coalesce _indices _values indices values _nnz _dimI _dimV
    crow_indices col_indices ccol_indices row_indices dense_dim sparse_dim
    _convert_indices_from_coo_to_csr _convert_indices_from_csr_to_coo _spdiags
    q_scale q_zero_point q_per_channel_scales q_per_channel_zero_points q_per_channel_axis
    qscheme int_repr _make_per_tensor_quantized_tensor _make_per_channel_quantized_tensor
    _empty_affine_quantized _empty_per_channel_affine_quantized empty_quantized
    quantized_max_pool1d quantized_max_pool2d quantized_max_pool3d
    mkldnn_max_pool2d mkldnn_max_pool3d mkldnn_max_pool2d_backward mkldnn_max_pool3d_backward
    mkldnn_reorder_conv2d_weight mkldnn_reorder_conv3d_weight _mkldnn_reshape
    _mkldnn_transpose _cudnn_rnn_flatten_weight _cudnn_init_dropout_state
    bernoulli rand rand_like randn randn_like randint randint_like randperm normal
    normal_functional uniform random cauchy exponential geometric log_normal binomial
    poisson multinomial _standard_gamma _sample_dirichlet _philox_key_fold_in
    _philox_key_split _philox_normal _philox_uniform _sobol_engine_draw _sobol_engine_ff
    _sobol_engine_initialize_state _sobol_engine_scramble _fill_mem_eff_dropout_mask
    fft_fftshift fft_ifftshift linalg_diagonal _linalg_check_errors lu_unpack
    sparse_coo_tensor sparse_csr_tensor sparse_csc_tensor sparse_bsr_tensor
    sparse_bsc_tensor sparse_compressed_tensor _sparse_coo_tensor_unsafe
    _sparse_csr_tensor_unsafe _sparse_csc_tensor_unsafe _sparse_bsr_tensor_unsafe
    _sparse_bsc_tensor_unsafe _sparse_compressed_tensor_unsafe
    _sparse_compressed_tensor_with_dims _sparse_coo_tensor_with_dims
    _sparse_coo_tensor_with_dims_and_tensors _sparse_broadcast_to sparse_mask
    _sparse_mask_projection sparse_resize sparse_resize_and_clear _sparse_sum
    _sparse_csr_sum _sparse_semi_structured_tile _sparse_semi_structured_apply
    _sparse_semi_structured_apply_dense copy_sparse_to_sparse flatten_dense_tensors
    unflatten_dense_tensors sum_to_size _add_relu _backward
    upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d
    _upsample_nearest_exact2d _upsample_nearest_exact3d upsample_nearest1d_backward
    upsample_nearest2d_backward upsample_nearest3d_backward
    _upsample_nearest_exact1d_backward _upsample_nearest_exact2d_backward
    _upsample_nearest_exact3d_backward
""".split())

#: multiply-free for real operands, multiply-bearing for complex ones (the audit counts
#: them when an operand is complex): op -> what a complex operand costs
COMPLEX_BEARING = {
    "sgn": "z/|z| for a complex z: a division by a square root of a sum of squares",
    "abs": "|z| for a complex z: a square root of a sum of squares",
    "absolute": "|z| for a complex z: a square root of a sum of squares",
}

#: multiply-free only for some values of one argument: op -> (argument, its position
#: when given positionally, its default, the values that multiply nothing)
CONDITIONAL = {
    **{op: ("alpha", 2, 1, (1,)) for op in ("add", "sub", "rsub", "_add_relu", "_foreach_add",
                                          "_foreach_sub")},
    "index_add": ("alpha", 4, 1, (1,)),
    **{op: ("reduce", 4, None, (None, "sum", "add", "amax", "amin"))
       for op in ("scatter_reduce", "scatter")},       # "prod", "mean", "multiply" multiply
    "index_reduce": ("reduce", 4, None, ("amax", "amin")),
    **{op: ("scale_grad_by_freq", 4, False, (False,))   # True divides by the counts
       for op in ("embedding_backward", "embedding_dense_backward", "embedding_sparse_backward")},
}

#: multiply-bearing aten ops left native on purpose, with the reason; listed in the
#: audit's report but not counted as escaped
NATIVE_BY_DESIGN = {
    "cos": "rotary position tables: a function of integer positions, no PA definition",
    "sin": "rotary position tables: a function of integer positions, no PA definition",
    **dict.fromkeys(
        ("hann_window", "hamming_window", "blackman_window", "kaiser_window",
         "bartlett_window"),
        "window tables: no tensor input, a constant of the window length (torch.stft's "
        "window, audio front ends), computed once by the host"),
}

#: integer arithmetic left native on purpose (a result of an integer dtype; a floating
#: or complex result of the same op counts as escaped)
INTEGER_BY_DESIGN = dict.fromkeys(
    ("mul", "div", "floor_divide", "remainder", "fmod", "pow", "prod", "cumprod"),
    "integer arithmetic (positions, bucket ids, shapes): exact, and the paper's PAM "
    "replaces floating-point multiplies")

#: aten ops that multiply, divide or evaluate a function, named where no family rule
#: of FAMILIES covers them (the emulated ones are derived from mode.py, not listed)
MULTIPLY_BEARING = frozenset("""
    acos acosh arccos arccosh asin asinh arcsin arcsinh atan atanh arctan arctanh atan2
    arctan2 angle cosh sinh tan sinc deg2rad rad2deg hypot polar
    erf erfc erfinv expm1 log10 log1p logit digamma lgamma mvlgamma polygamma i0 igamma
    igammac logaddexp logaddexp2 logsumexp logcumsumexp _logcumsumexp xlogy
    float_power square ldexp floor_divide remainder fmod gcd lcm prod cumprod
    addcmul addcdiv lerp addr kron vdot cross chain_matmul bilinear _trilinear
    _compute_linear_combination _addmm_activation _int_mm _grouped_mm _scaled_mm
    _scaled_mm_v2 _scaled_grouped_mm _scaled_grouped_mm_v2 _mixed_dtypes_linear
    _wrapped_linear_prepack _wrapped_quantized_linear_prepacked smm sspaddmm hspmm
    convolution _convolution _convolution_mode convolution_overrideable _conv_depthwise2d
    conv_depthwise3d conv_tbc
    _softmax _log_softmax _safe_softmax _masked_softmax _native_multi_head_attention
    _transform_bias_rescale_qkv _transformer_encoder_layer_fwd
    native_layer_norm native_group_norm native_batch_norm _native_batch_norm_legit
    _native_batch_norm_legit_functional _native_batch_norm_legit_no_training
    _batch_norm_impl_index _batch_norm_no_update _batch_norm_with_update
    _batch_norm_with_update_functional batch_norm_elemt batch_norm_gather_stats
    batch_norm_gather_stats_with_counts batch_norm_stats batch_norm_update_stats
    _fused_rms_norm native_norm norm_except_dim _weight_norm _weight_norm_interface
    frobenius_norm nuclear_norm renorm embedding_renorm dist cdist _cdist_forward pdist
    _pdist_forward _euclidean_dist cosine_embedding_loss hinge_embedding_loss
    margin_ranking_loss multi_margin_loss multilabel_margin_loss
    multilabel_margin_loss_forward poisson_nll_loss soft_margin_loss triplet_margin_loss
    nll_loss_nd nll_loss_forward nll_loss2d nll_loss2d_forward ctc_loss _ctc_loss
    var std var_mean std_mean nanmean quantile nanquantile cov corrcoef histc histogram
    histogramdd _histogramdd_bin_edges _histogramdd_from_bin_cts
    _histogramdd_from_bin_tensors segment_reduce gradient trapezoid trapz
    cumulative_trapezoid vander isclose allclose
    elu celu selu leaky_relu prelu _prelu_kernel rrelu rrelu_with_noise
    rrelu_with_noise_functional glu glu_jvp mish hardsigmoid hardswish log_sigmoid
    log_sigmoid_forward
    dropout feature_dropout alpha_dropout feature_alpha_dropout native_dropout
    _fused_dropout _masked_scale
    gru_cell lstm_cell rnn_tanh_cell rnn_relu_cell _lstm_mps
    _adaptive_avg_pool2d _adaptive_avg_pool3d fractional_max_pool2d fractional_max_pool3d
    _upsample_bilinear2d_aa _upsample_bicubic2d_aa _upsample_lanczos2d_aa grid_sampler
    grid_sampler_2d grid_sampler_3d _grid_sampler_2d_cpu_fallback affine_grid_generator
    stft istft linspace logspace
    det logdet slogdet inverse pinverse matrix_exp matrix_power cholesky cholesky_inverse
    cholesky_solve _cholesky_solve_helper qr geqrf orgqr ormqr svd triangular_solve
    lu_solve _lu_with_info _spsolve
    dequantize quantize_per_tensor quantize_per_tensor_dynamic quantize_per_channel
    choose_qparams_optimized _choose_qparams_per_tensor fused_moving_avg_obs_fake_quant
    _fused_moving_avg_obs_fq_helper _fused_moving_avg_obs_fq_helper_functional
    _fused_adam _fused_adamw _fused_sgd _fused_adagrad _amp_foreach_non_finite_check_and_unscale
    _amp_update_scale _dirichlet_grad _standard_gamma_grad _foobar
    _nested_tensor_softmax_with_shape embedding_bag _embedding_bag _embedding_bag_forward_only
    _foreach_powsum
""".split())


def _base(op: str) -> str | None:
    """``_foreach_X``, ``special_X`` and ``X_copy`` are X's arithmetic in another form:
    multiply-free where X is, else multiply-bearing (pam_mode routes none of them)."""
    cls = classify(op)
    if cls is None:
        return None
    return FREE if cls[0] == FREE else BEARING


#: rules for ops that share one, tried in order after the explicit names: (pattern of the
#: whole name, class or a function of the pattern's ``base`` group, reason)
FAMILIES = (
    (r"_foreach_(?P<base>.+)", _base, "a list form of the base op"),
    (r"special_(?P<base>.+)", _base, "torch.special's spelling of the base op"),
    (r"special_.+", BEARING, "special functions: series and rational approximations"),
    (r"(?P<base>.+)_copy", _base, "the copying form of a view"),
    (r"_?linalg_.+", BEARING, "linear algebra: products, factorizations, solves"),
    (r"_?fft_.+", BEARING, "Fourier transforms (complex products) and their frequency grids"),
    (r"_?to_sparse.*|_validate_.+", FREE, "sparse layout conversions and checks"),
    (r"_?sparse_.+", BEARING, "sparse arithmetic (the constructors are listed as free)"),
    (r"_?nested_.+", FREE, "nested-tensor layout and metadata"),
    (r"_?fake_quantize_.+|quantized_.+", BEARING, "quantization: scaling by the scale"),
    (r".+_backward(_.+)?|.+_double_backward", BEARING,
     "a derivative: the chain rule multiplies (data movement's are listed as free)"),
    (r"(_?cudnn|_?miopen|_?mkldnn|_?mps|fbgemm|_nnpack|_?slow_conv|_?thnn)_?.+"
     r"|_scaled_dot_product_.+|_flash_attention_.+|_efficient_attention_.+|_triton_.+"
     r"|_weight_int.+|_dyn_quant_.+|_cslt_.+", BEARING,
     "a backend kernel of convolution, matmul, attention, normalization or RNN"),
    (r"_test_.+", BEARING, "torch's own test ops"),
)
_FAMILIES = tuple((re.compile(p), rule, why) for p, rule, why in FAMILIES)
#: pam_mode's torch functions named otherwise than their aten op
_ALIASES = {"truediv": "div", "cross_entropy": "cross_entropy_loss"}
#: pam_mode's torch functions written in Python that route several aten ops
_ROUTES = {"interpolate": ("upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d",
                           "upsample_trilinear3d")}


def packet(name: str) -> str:
    """The classified name of an aten overload packet: an in-place ``op_`` is ``op``
    (dunder names such as ``__iand__`` are kept)."""
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _aten_name(func) -> str | None:
    """The aten op a torch function of pam_mode's table dispatches as, or None for one
    written in Python without an aten op of its own (F.multi_head_attention_forward)."""
    name = func.__name__
    if name.startswith("__") and name.endswith("__"):   # Tensor.__rmul__, __idiv__, ...
        name = name[2:-2]
        if not hasattr(torch.ops.aten, name) and name[:1] in ("r", "i"):
            name = name[1:]
    name = _ALIASES.get(packet(name), packet(name))
    return name if hasattr(torch.ops.aten, name) else None


@functools.cache
def emulated() -> dict[str, tuple[str, ...]]:
    """The aten ops pam_mode routes: aten name -> the torch functions of
    torch_bridge/mode.py's handler table that reach it."""
    from .mode import _HANDLERS
    found: dict[str, list[str]] = {}
    for func in _HANDLERS:
        for name in _ROUTES.get(func.__name__, ()) or (_aten_name(func),):
            if name is not None:
                found.setdefault(name, []).append(_spelling(func))
    return {k: tuple(sorted(set(v))) for k, v in sorted(found.items())}


def _spelling(func) -> str:
    """How a user spells ``func``: ``F.gelu``, ``torch.mul``, ``Tensor.__rmul__``, ..."""
    import torch.nn.functional as F
    for prefix, owner in (("F", F), ("torch", torch), ("torch.linalg", torch.linalg),
                          ("torch.special", torch.special), ("Tensor", torch.Tensor)):
        for attr in (func.__name__, func.__name__.removeprefix("linalg_"),
                     func.__name__.removeprefix("special_")):
            if getattr(owner, attr, None) is func:
                return f"{prefix}.{attr}"
    attrs = [a for a in dir(torch.Tensor) if getattr(torch.Tensor, a, None) is func]
    return f"Tensor.{attrs[0]}" if attrs else f"{func.__module__}.{func.__qualname__}"


@functools.cache
def classify(op: str) -> tuple[str, str] | None:
    """``(class, reason)`` of an aten op (its packet name, in-place ``_`` allowed), or None
    if no table or rule names it (the audit then counts it as escaped)."""
    op = packet(op)
    if op in NATIVE_BY_DESIGN:
        return BY_DESIGN, NATIVE_BY_DESIGN[op]
    if op in MULTIPLY_FREE:
        return FREE, "listed"
    if op in emulated():
        return EMULATED, "routed by pam_mode: " + ", ".join(emulated()[op])
    if op in MULTIPLY_BEARING:
        return BEARING, "listed"
    for pattern, rule, why in _FAMILIES:
        m = pattern.fullmatch(op)
        if m is None:
            continue
        cls = rule(m["base"]) if callable(rule) else rule
        if cls is not None:
            return cls, why
    return None
