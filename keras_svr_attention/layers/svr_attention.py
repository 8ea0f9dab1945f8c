"""SVRAttention: multi-head attention as H support vector expansions."""

import keras
import numpy as np
from keras import ops

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.functional import conv
from keras_svr_attention.functional import decoding
from keras_svr_attention.functional._tensors import positions
from keras_svr_attention.functional._tensors import shape_of
from keras_svr_attention.layers import _common as common
from keras_svr_attention.layers import _validation as check


@svr_export
class SVRAttention(common.SVRLayer, keras.layers.MultiHeadAttention):
    """Multi-head attention with the options of the primal-dual framework.

    Each head evaluates a support vector expansion at the queries. With every
    option off this is `keras.layers.MultiHeadAttention`: the same four
    projections, call signature, masks and outputs. The options combine:

    ```text
    Attention-BN (Eqn 26; Eqn 22 with standardize):
      h_i = sum_j softmax_j((q_i - b mu_i)^T (k_j - b mu_i) / sqrt(D)) v_j
    Attention-SH (Eqn 25): head s attends to keys and values average-pooled
      by r_s along the sequence.
    Attention-BN+SH (Eqn 51): mu_i over the head's own pooled keys.
    ```

    where b is `beta`, mu_i the mean of the keys query i may attend to (per
    sample and head) and r_s is `head_factors[s]`. Which key each query
    sees, how windows pool and what causality means are on the rules page
    ("Statistics", "Visibility", "Windows", "Causal windows"). A row that
    sees no key outputs zero. Every head group goes through the projection
    sublayers' own `call`, so `quantize`, LoRA and dtype policies apply.
    Subclasses override `_compute_attention` (softmax, MultiHeadAttention's
    hook) or `_compute_linear_attention`, per group of heads.

    Args:
        num_heads: int. Number of heads N.
        key_dim: int. Head dimension D of queries and keys.
        attention_axes: must be None (the sequence axis).
        beta: float or None. Recentering weight b; None or 0 turns BN off.
        standardize: bool. Also divide by the keys' standard deviation
            (Eqn 22).
        learn_beta: bool. Learn b as one scalar, initialised at `beta`.
        epsilon: float > 0. Added to sigma^2 under `standardize`.
        head_factors: list of int >= 1, one per head, or None (all 1).
        num_prefix_tokens: int >= 0. Leading tokens (a CLS token) that are
            never pooled.
        kernel: "softmax" or "linear" (Phi(x) = elu(x) + 1, O(T); padding
            and causal masks only; the rules page, "Linear kernel").
        chunk_size: int > 0. Chunk of the causal linear recurrence.
        sparsity: None, "local", "strided" or "fixed" (Child et al. 2019),
            with `block_size` its window, stride or block.
        block_size: int. Size of the sparse pattern.
        conv_kernel_size: int or None. Attention-Conv: a depth-wise kernel
            on the projected queries and keys before the scores.
        conv_grid: (height, width) or None. Convolve in 2-D over the patch
            grid instead.
        **kwargs: the other arguments of `MultiHeadAttention`, with their
            meaning there (`value_dim`, `dropout`, `use_bias`,
            `output_shape`, `sliding_window`, `use_gate`, initializers...).
            `flash_attention=True` is refused where it is there, and on
            TensorFlow and with `kernel="linear"`.

    Call arguments:
        query: `(B, T, dim_q)`. value: `(B, S, dim_v)`. key: `(B, S, dim_k)`
            or None (use `value`).
        query_mask, value_mask, key_mask: `(B, T)` / `(B, S)` padding
            masks; taken from the inputs' Keras masks when not given.
        attention_mask: boolean `(B, T, S)`, `(T, S)` or `(B, N, T, S)`.
        return_attention_scores: bool. Also return `(B, N, T, S)`; a
            pooled window's weight is spread over its valid tokens.
        training: bool. Dropout on or off.
        use_causal_mask: bool. Query i sees only keys j <= i.
        cache: a decoding state (`get_initial_state`, with
            `use_causal_mask=True`), or `(B, 2, S, N, key_dim)`: KerasHub's
            cached attention contract (the rules page, "Caches"), or None.
        cache_update_index: int or int tensor, or None.

    Returns:
        `(B, T, dim_out)`, then the scores if asked, then the updated cache
        or state if one was given.

    Examples:
        >>> layer = SVRAttention(num_heads=4, key_dim=16, beta=1.0,
        ...                      head_factors=[1, 1, 2, 4])
        >>> x = keras.random.normal((2, 10, 64), seed=0)
        >>> tuple(layer(x, x, use_causal_mask=True).shape)
        (2, 10, 64)

    References:
        Nguyen et al., "A Primal-Dual Framework for Transformers and Neural
        Networks", ICLR 2023.
    """

    # Long: MultiHeadAttention's arguments and ours, one per line.
    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        flash_attention=None,
        sliding_window=None,
        use_gate=False,
        beta=None,
        standardize=False,
        learn_beta=False,
        epsilon=1e-5,
        head_factors=None,
        num_prefix_tokens=0,
        kernel="softmax",
        chunk_size=64,
        sparsity=None,
        block_size=None,
        conv_kernel_size=None,
        conv_grid=None,
        **kwargs,
    ):
        dropout, self.options = check.attention_options(
            num_heads, key_dim, value_dim,
            dropout=dropout, attention_axes=attention_axes,
            flash_attention=flash_attention, sliding_window=sliding_window,
            use_gate=use_gate, sparsity=sparsity, block_size=block_size,
            conv_kernel_size=conv_kernel_size, conv_grid=conv_grid,
            beta=beta,
            standardize=standardize, learn_beta=learn_beta, epsilon=epsilon,
            head_factors=head_factors, num_prefix_tokens=num_prefix_tokens,
            kernel=kernel, chunk_size=chunk_size,
        )  # fmt: skip
        newer = {}
        if self.options.use_gate:  # keras_supports("use_gate") was checked
            newer["use_gate"] = True
        super().__init__(
            num_heads=int(num_heads),
            key_dim=int(key_dim),
            value_dim=None if value_dim is None else int(value_dim),
            dropout=dropout,
            use_bias=use_bias,
            output_shape=output_shape,
            attention_axes=None,
            flash_attention=self.options.flash_attention,
            **newer,
            **kwargs,
        )
        # MultiHeadAttention's own attributes, read by its build and config
        # (the sliding window mask is built here on every Keras).
        self._use_gate = self.options.use_gate
        self._plan_options = self.options
        self._sliding_window = self.options.sliding_window
        if self.options.flash_attention is False:
            # MultiHeadAttention keeps `False or <global setting>` (None):
            # an explicit False must reach the kernel as False.
            self._flash_attention = False

    @property
    def beta(self):
        return self.options.beta

    @property
    def num_prefix_tokens(self):
        return self.options.num_prefix_tokens

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (
            ("query", query_shape),
            ("value", value_shape),
            ("key", key_shape),
        ):
            check.sequence_shape(name, shape)
        batch = {query_shape[0], value_shape[0], key_shape[0]} - {None}
        if len(batch) > 1:
            raise ValueError(
                "`query`, `value` and `key` must have the same batch size. "
                f"Received: query.shape={tuple(query_shape)}, "
                f"value.shape={tuple(value_shape)}, "
                f"key.shape={tuple(key_shape)}"
            )
        if value_shape[1] != key_shape[1]:
            raise ValueError(
                "The lengths of `key` and `value` must be equal. Received: "
                f"key.shape={tuple(key_shape)}, "
                f"value.shape={tuple(value_shape)}"
            )
        self._check_prefix(value_shape[1])
        super().build(query_shape, value_shape, key_shape)
        if self.options.conv_kernel_size:
            size = self.options.conv_kernel_size
            shape = (size, size) if self.options.conv_grid else (size,)
            # Identity at start: a delta at the centre tap.
            delta = np.zeros(shape, "float32")
            delta[(size // 2,) * len(shape)] = 1.0
            self.query_conv, self.key_conv = (
                self.add_weight(
                    name=name,
                    shape=shape,
                    initializer=keras.initializers.Constant(delta),
                )
                for name in ("query_conv", "key_conv")
            )
        self._build_beta()

    def _check_prefix(self, length):
        if length is not None and self.options.num_prefix_tokens > length:
            raise ValueError(
                "`num_prefix_tokens` must not exceed the key length "
                f"(S={length}). Received: "
                f"num_prefix_tokens={self.options.num_prefix_tokens}"
            )

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
    ):
        if return_attention_scores and self._flash_attention:
            self._refuse_scores_under_flash()
        query, value, key, query_mask, key_padding = common.input_masks(
            query, value, key,
            query_mask=query_mask, value_mask=value_mask, key_mask=key_mask,
        )  # fmt: skip
        gate = self._gate_dense(query) if self._use_gate else None
        query = self._query_dense(query)
        transform_key = None
        if self.options.conv_kernel_size:
            query = self._convolve(query, self.query_conv, use_causal_mask)

            def transform_key(key):
                return self._convolve(key, self.key_conv, use_causal_mask)

        if isinstance(cache, dict):
            return self._call_with_state(
                query, key, value, gate,
                query_mask=query_mask, key_padding=key_padding,
                attention_mask=attention_mask,
                return_scores=return_attention_scores,
                causal=use_causal_mask, state=cache, index=cache_update_index,
            )  # fmt: skip
        if cache is None and cache_update_index is not None:
            self._refuse_index_without_cache(cache_update_index)
        offset, pending = 0, None
        if cache is None:
            key, value = self._key_dense(key), self._value_dense(value)
        else:
            key, value, cache, key_padding, pending, offset = self._cached(
                cache, cache_update_index, key, value, key_padding
            )
        output, scores = self._svr_attention(
            query, key, value,
            query_mask=query_mask, key_padding=key_padding,
            attention_mask=attention_mask, causal=use_causal_mask,
            training=training, return_scores=return_attention_scores,
            offset=offset, pending=pending, transform_key=transform_key,
        )  # fmt: skip
        if gate is not None:
            output = ops.multiply(output, gate)
        output = self._output_dense(output)
        results = (output,) + (scores,) * bool(return_attention_scores)
        results += (cache,) * (cache is not None)
        return results[0] if len(results) == 1 else results

    def _refuse_index_without_cache(self, cache_update_index):
        raise ValueError(
            "`cache_update_index` needs a `cache`. Received: "
            f"cache=None, cache_update_index={cache_update_index!r}"
        )

    def _call_with_state(
        self, query, key, value, gate, query_mask, key_padding,
        attention_mask, return_scores, causal, state, index,
    ):  # fmt: skip
        """`call` with a decoding state as `cache` (`get_initial_state`):
        projected query, raw key and value -> `(output, new state)`."""
        self._check_state_call(
            query, value,
            attention_mask=attention_mask, return_scores=return_scores,
            causal=causal, index=index,
        )  # fmt: skip
        output, state = self._decode_state(
            query, self._key_dense(key), self._value_dense(value),
            query_mask=query_mask, key_padding=key_padding, state=state,
            limit=getattr(self, "_prefill_limit", None),
        )  # fmt: skip
        if gate is not None:
            output = ops.multiply(output, gate)
        return self._output_dense(output), state

    def _head_dims(self):
        return self._key_dim, self._value_dim or self._key_dim

    def _cached(self, cache, index, key, value, key_padding):
        """KerasHub's `CachedMultiHeadAttention` contract.

        `cache` `(B, 2, S, N, D)` holds projected keys and values per
        position. With `index`, the new keys and values are projected and
        written at `index` (query t stands at position `index + t`);
        without, the cache is read as is. Returns the keys, values, cache,
        the key padding over the cache's slots (the new tokens' padding
        written at `index`, earlier slots valid), the `(1, S)` pending
        slots (positions after the new tokens), or None without `index`,
        and the position of query 0 (`index`, or 0).
        """
        if self.options.conv_kernel_size:
            raise ValueError(
                "`cache` needs no `conv_kernel_size`: the convolution of "
                "cached keys would need the tokens around them. Received: "
                f"conv_kernel_size={self.options.conv_kernel_size!r}"
            )
        key_cache, value_cache = cache[:, 0], cache[:, 1]
        self._check_prefix(key_cache.shape[1])
        if index is None:
            if key_padding is not None:
                raise ValueError(
                    "`value_mask` and `key_mask` need `cache_update_index`: "
                    "they pad the new tokens written there. Give the padding "
                    "of cached positions in `attention_mask`."
                )
            return key_cache, value_cache, cache, None, None, 0
        num_new = shape_of(key)[1]
        key, value, cache = decoding.write_key_value_cache(
            cache, index, self._key_dense(key), self._value_dense(value)
        )
        batch, num_keys = shape_of(key)[:2]
        first = ops.cast(index, "int32")  # position of the first new token
        pending = positions(num_keys)[None] >= first + num_new
        if key_padding is not None:
            slots = ops.ones((batch, num_keys), "int32")
            key_padding = ops.slice_update(
                slots, [0, first], ops.cast(key_padding, "int32")
            )
            key_padding = ops.cast(key_padding, "bool")
        # `index` as given: a Python 0 keeps the planner's causal fast path.
        return key, value, cache, key_padding, pending, index

    def _convolve(self, x, kernel, causal):
        """Attention-Conv1D/2D: the shared depth-wise `kernel` on q or k."""
        kernel = ops.cast(kernel, x.dtype)
        if self.options.conv_grid is None:
            return conv.conv_sequence(
                x, kernel, causal, self.options.num_prefix_tokens
            )
        if causal:
            raise ValueError(
                "`use_causal_mask` cannot combine with `conv_grid`: a 2-D "
                "convolution over the patch grid looks at later patches. "
                f"Received: conv_grid={self.options.conv_grid}"
            )
        return conv.conv_grid(
            x, kernel, self.options.conv_grid, self.options.num_prefix_tokens
        )

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
    ):
        output_shape = self.compute_output_shape(
            query.shape, value.shape, None if key is None else key.shape
        )
        results = (keras.KerasTensor(output_shape, dtype=self.compute_dtype),)
        if return_attention_scores:
            num_keys = value.shape[1] if cache is None else cache.shape[2]
            scores_shape = (
                query.shape[0],
                self._num_heads,
                query.shape[1],
                num_keys,
            )
            results += (keras.KerasTensor(scores_shape, self.compute_dtype),)
        if isinstance(cache, dict):
            return results[0], common.state_spec(cache)
        if cache is not None:
            results += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return results[0] if len(results) == 1 else results

    def get_config(self):
        config = super().get_config()
        config["attention_axes"] = None  # build() fills in (1,)
        config.update(self.options.get_config())
        return config

    @classmethod
    def from_config(cls, config):
        # Saved by 0.4 or earlier: KerasHub's calling convention was two
        # options of this class, now the converter's CachedSVRAttention.
        config = dict(config)
        keras_masks = config.pop("use_keras_masks", True)
        state = config.pop("state_cache", False)
        if keras_masks is False or state:
            config["decode_with_state"] = bool(state)
            return keras.saving.get_registered_object(
                "keras_svr_attention>CachedSVRAttention"
            ).from_config(config)
        return super().from_config(config)
