"""SVRAttention: multi-head attention as H support vector expansions."""

import keras
import numpy as np
from keras import ops

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.functional import conv
from keras_svr_attention.functional import kernels
from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional import pooling
from keras_svr_attention.functional import statistics
from keras_svr_attention.layers import _validation as check


@svr_export
class SVRAttention(keras.layers.MultiHeadAttention):
    """Multi-head attention with the options of the primal-dual framework.

    Each head evaluates a support vector expansion at the queries. With every
    option off this is `keras.layers.MultiHeadAttention`: the same four
    projections (`query_dense`, `key_dense`, `value_dense`, `output_dense`),
    the same call signature and masks, the same outputs. Two options change
    the SVR behind each head, and they combine:

    ```text
    Attention-BN (Eqn 26; Eqn 22 with standardize):
      h_i = sum_j softmax_j((q_i - b mu_i)^T (k_j - b mu_i) / sqrt(D)) v_j
    Attention-SH (Eqn 25): head s attends to keys and values average-pooled
      by r_s along the sequence (pooled before the K/V projections).
    Attention-BN+SH (Eqn 51): mu_i over the head's own pooled keys.
    ```

    where:
    - `b` is `beta` (a trainable scalar when `learn_beta`);
    - `mu_i` (and `sigma_i^2`) are the mean (and population variance) of the
      keys query i may attend to, per sample and per head; with
      `standardize`, q and k become `(x - b mu) / sqrt(sigma^2 + epsilon)`;
    - `r_s` is `head_factors[s]`; the first `num_prefix_tokens` keys are
      never pooled.

    Relation to the paper (SPEC.md sections 2, 3, 6): mu is taken over the
    keys a query may see (padding left out; under a causal mask mu_i is the
    mean of k_1..k_i). SH windows have stride = size = r, the last one
    shorter; padded tokens are left out of each average; a query sees a
    window when it may see every valid token in it. A query row that sees no
    key outputs exactly zero.

    Args:
        num_heads: int. Number of heads N.
        key_dim: int. Head dimension D of queries and keys.
        value_dim: int or None. Head dimension of values. Defaults to
            `key_dim`.
        dropout: float. Dropout rate on the attention weights.
        use_bias: bool. Whether the projections have biases.
        output_shape: int, tuple or None. Output feature shape. Defaults to
            the query's feature size.
        attention_axes: must be None (attention over the sequence axis).
        flash_attention: bool or None. Passed to
            `keras.ops.dot_product_attention`.
        beta: float or None. Recentering weight b of Eqn 26; None or 0
            turns recentering off. Defaults to None.
        standardize: bool. Also divide by the keys' standard deviation
            (Eqn 22). Defaults to False.
        learn_beta: bool. Learn b as one scalar weight, initialised at
            `beta` (which must then be given). Defaults to False.
        epsilon: float > 0. Added to sigma^2 under `standardize`. Defaults
            to 1e-5.
        head_factors: list of int >= 1, one per head, or None (all 1).
            Pooling factor r_s of Attention-SH. Defaults to None.
        num_prefix_tokens: int >= 0. Leading tokens (a CLS token) that are
            never pooled. Defaults to 0.
        kernel: "softmax" or "linear". The SVR's feature map: exp(q^T k)
            or Phi(x) = elu(x) + 1, computed as Phi(Q) (Phi(K)^T V) or with
            prefix sums under causality, O(T) without a T x S matrix. The
            linear kernel takes padding and causal masks only; under BN it
            shifts both q and k before Phi (causal: query i by the mean of
            the keys it sees, key j by the mean of keys 0..j). Defaults to
            "softmax".
        sparsity: None, "local", "strided" or "fixed". A sparse pattern:
            query i fits its SVR on the subset M_i of keys allowed by the
            pattern (Child et al. 2019; `functional.masks`), with
            `block_size` its window, stride or block. BN takes mu_i over
            M_i; SH applies the pattern to pooled windows by the rule above
            (a window is seen when every valid token of it is). Defaults to
            None.
        block_size: int. Size of the sparse pattern.
        conv_kernel_size: int or None. Attention-Conv1D/2D: convolve the
            projected queries and keys with one learned depth-wise kernel
            of this size, shared by every channel (weights `query_conv`,
            `key_conv`, initialised to the identity), before the scores.
            Causal masks drop the taps that look ahead; SH heads
            convolve their pooled keys. Defaults to None.
        conv_grid: (height, width) or None. Convolve in 2-D over the
            image's patch grid (after `num_prefix_tokens` CLS tokens)
            instead of along the sequence. Needs unpooled heads.
        **kwargs: the remaining arguments of
            `keras.layers.MultiHeadAttention` (initializers, regularizers,
            constraints, `seed`, `name`, `dtype`).

    Call arguments:
        query: `(B, T, dim_q)`.
        value: `(B, S, dim_v)`.
        key: `(B, S, dim_k)` or None (use `value`).
        query_mask, value_mask, key_mask: `(B, T)` / `(B, S)` padding
            masks; taken from the inputs' Keras masks when not given.
        attention_mask: boolean `(B, T, S)` (or broadcastable), True where
            query i may attend to key j.
        return_attention_scores: bool. Also return the weights
            `(B, N, T, S)`; for pooled heads a window's weight is spread
            evenly over its valid tokens, so scores @ values is the output.
        training: bool. Dropout on or off.
        use_causal_mask: bool. Query i sees only keys j <= i.

    Returns:
        `(B, T, dim_out)`, and the scores if asked.

    Example:
    ```python
    layer = SVRAttention(num_heads=4, key_dim=16, beta=1.0,
                         head_factors=[1, 1, 2, 4])
    x = keras.random.normal((2, 10, 64))
    y = layer(x, x, use_causal_mask=True)  # (2, 10, 64)
    ```

    References:
        Nguyen et al., "A Primal-Dual Framework for Transformers and Neural
        Networks", ICLR 2023.
    """

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
        beta=None,
        standardize=False,
        learn_beta=False,
        epsilon=1e-5,
        head_factors=None,
        num_prefix_tokens=0,
        kernel="softmax",
        sparsity=None,
        block_size=None,
        conv_kernel_size=None,
        conv_grid=None,
        **kwargs,
    ):
        options = check.attention_options(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout=dropout,
            attention_axes=attention_axes,
            beta=beta,
            learn_beta=learn_beta,
            epsilon=epsilon,
            head_factors=head_factors,
            num_prefix_tokens=num_prefix_tokens,
            kernel=kernel,
            sparsity=sparsity,
            block_size=block_size,
            conv_kernel_size=conv_kernel_size,
            conv_grid=conv_grid,
        )
        self._beta = options["beta"]
        self._epsilon = options["epsilon"]
        self._head_factors = options["head_factors"]
        self._num_prefix_tokens = num_prefix_tokens
        self._kernel = kernel
        self._sparsity = sparsity
        self._block_size = block_size
        self._conv_kernel_size = conv_kernel_size
        self._conv_grid = options["conv_grid"]
        self._standardize = bool(standardize)
        self._learn_beta = bool(learn_beta)
        self._flash_attention_arg = flash_attention
        super().__init__(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout=dropout,
            use_bias=use_bias,
            output_shape=output_shape,
            attention_axes=None,
            flash_attention=flash_attention,
            **kwargs,
        )
        for name, off in (("sliding_window", None), ("use_gate", False)):
            if getattr(self, f"_{name}", off) not in (off,):
                raise ValueError(
                    f"`{name}` is not supported by SVRAttention. "
                    f"Received: {name}={getattr(self, f'_{name}')!r}"
                )
        # Heads grouped by factor, in order of first appearance.
        groups = {}
        for head, factor in enumerate(self._head_factors):
            groups.setdefault(factor, []).append(head)
        self._groups = list(groups.items())
        order = [h for _, heads in self._groups for h in heads]
        self._head_order = None
        if order != list(range(num_heads)):
            self._head_order = [order.index(h) for h in range(num_heads)]

    @property
    def beta(self):
        return self._beta

    @property
    def head_factors(self):
        return self._head_factors

    @property
    def num_prefix_tokens(self):
        return self._num_prefix_tokens

    @property
    def uses_bn(self):
        """Whether queries are recentered (beta, learn_beta or standardize)."""
        return bool(self._beta) or self._learn_beta or self._standardize

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
                "`key` and `value` must have the same length. Received: "
                f"key.shape={tuple(key_shape)}, "
                f"value.shape={tuple(value_shape)}"
            )
        self._check_prefix(value_shape[1])
        super().build(query_shape, value_shape, key_shape)
        if self._conv_kernel_size:
            size = self._conv_kernel_size
            shape = (size, size) if self._conv_grid else (size,)
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
        if self._learn_beta:
            self.beta_weight = self.add_weight(
                name="beta",
                shape=(),
                initializer=keras.initializers.Constant(self._beta),
                trainable=True,
            )

    def _check_prefix(self, length):
        if length is not None and self._num_prefix_tokens > length:
            raise ValueError(
                "`num_prefix_tokens` must not exceed the key length "
                f"(S={length}). Received: "
                f"num_prefix_tokens={self._num_prefix_tokens}"
            )

    def _check_attention_mask(self, mask, batch, num_queries, num_keys):
        expected = (batch, num_queries, num_keys)
        ok = len(mask.shape) == 3 and all(
            d is None or e is None or d in (1, e)
            for d, e in zip(mask.shape, expected, strict=True)
        )
        if not ok:
            raise ValueError(
                "`attention_mask` must broadcast to (B, T, S) = "
                f"{expected}. Received: attention_mask.shape="
                f"{tuple(mask.shape)}"
            )

    def _project(self, dense, x, heads):
        """Projects `x` onto the given heads only (all heads: `dense(x)`)."""
        if len(heads) == self._num_heads:
            return dense(x)
        dtype = self.compute_dtype
        kernel = _select_heads(ops.cast(dense.kernel, dtype), heads, axis=1)
        out = ops.einsum("bsf,fnd->bsnd", ops.cast(x, dtype), kernel)
        if dense.bias is not None:
            bias = ops.cast(dense.bias, dtype)
            out = out + _select_heads(bias, heads, axis=0)
        return out

    def _beta_value(self):
        if self._learn_beta:
            return ops.cast(self.beta_weight, "float32")
        return self._beta or 0.0

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
    ):
        key_is_value = key is None or key is value
        key = value if key is None else key
        num_queries, num_keys = query.shape[1], value.shape[1]
        self._check_prefix(num_keys)
        if attention_mask is not None:
            self._check_attention_mask(
                attention_mask, query.shape[0], num_queries, num_keys
            )
        key_padding = masks_lib.merge_masks(
            masks_lib.padding_mask(value_mask),
            None if key_is_value else masks_lib.padding_mask(key_mask),
        )

        # Fresh tensors: the masks are consumed here, and a sublayer given a
        # tensor with a Keras mask attached warns that it drops it.
        if query_mask is not None:
            query = ops.copy(query)
        if value_mask is not None or key_mask is not None:
            value = ops.copy(value)
            key = value if key_is_value else ops.copy(key)

        query = self._convolve(
            self._query_dense(query), "query", use_causal_mask
        )
        if self._kernel == "linear":
            outputs, scores = self._linear_heads(
                query,
                key,
                value,
                key_is_value,
                query_mask,
                key_padding,
                attention_mask,
                use_causal_mask,
                return_attention_scores,
            )
        else:
            sparse = None
            if self._sparsity is not None:
                sparse = masks_lib.sparse_mask(
                    self._sparsity, num_queries, num_keys, self._block_size
                )
            outputs, scores = self._softmax_heads(
                query,
                key,
                value,
                key_is_value,
                query_mask,
                masks_lib.merge_masks(key_padding, attention_mask, sparse),
                use_causal_mask,
                training,
                return_attention_scores,
            )

        output = self._merge_heads(outputs, axis=2)
        output = self._output_dense(output)
        if return_attention_scores:
            return output, self._merge_heads(scores, axis=1)
        return output

    def _merge_heads(self, tensors, axis):
        merged = (
            tensors[0]
            if len(tensors) == 1
            else ops.concatenate(tensors, axis=axis)
        )
        if self._head_order is not None:
            merged = ops.take(merged, self._head_order, axis=axis)
        return merged

    def _convolve(self, x, which, causal):
        """Attention-Conv1D/2D: the shared depth-wise kernel on q or k."""
        if not self._conv_kernel_size:
            return x
        kernel = self.query_conv if which == "query" else self.key_conv
        kernel = ops.cast(kernel, x.dtype)
        if self._conv_grid is None:
            return conv.conv_sequence(
                x, kernel, causal, self._num_prefix_tokens
            )
        if causal:
            raise ValueError(
                "`use_causal_mask` cannot combine with `conv_grid`: a 2-D "
                "convolution over the patch grid looks at later patches. "
                f"Received: conv_grid={self._conv_grid}"
            )
        return conv.conv_grid(
            x, kernel, self._conv_grid, self._num_prefix_tokens
        )

    def _group_query(self, query, heads):
        if len(heads) == self._num_heads:
            return query
        return _select_heads(query, heads, axis=2)

    def _group_keys(self, key, value, key_is_value, heads, factor, valid):
        """Projected keys and values of one group of heads.

        Factor 1: the inputs projected onto the group's heads. Factor r > 1
        (Eqn 25): the inputs pooled over windows of their valid tokens,
        then projected. Returns `(key, value, counts)`, `counts` the valid
        tokens per window (None for factor 1).
        """
        if factor == 1:
            return (
                self._project(self._key_dense, key, heads),
                self._project(self._value_dense, value, heads),
                None,
            )
        p = self._num_prefix_tokens
        pooled_key, counts = pooling.pool_sequence(key, factor, p, valid)
        pooled_value = pooled_key
        if not key_is_value:
            pooled_value, _ = pooling.pool_sequence(value, factor, p, valid)
        group_key = self._project(self._key_dense, pooled_key, heads)
        group_value = self._project(self._value_dense, pooled_value, heads)
        return group_key, group_value, counts

    def _softmax_heads(
        self,
        query,
        key,
        value,
        key_is_value,
        query_mask,
        key_mask,
        causal,
        training,
        return_scores,
    ):
        """Softmax (and BN) attention of every group of heads.

        `key_mask` holds every constraint but the query padding and the
        causal one: `(B|1, 1|T, S)` or None.
        """
        p = self._num_prefix_tokens
        num_queries, num_keys = query.shape[1], value.shape[1]
        rows = masks_lib.query_padding_mask(query_mask)
        mask = masks_lib.broadcast_keys(
            masks_lib.merge_masks(rows, key_mask), num_keys
        )
        pooled = any(f > 1 for f, _ in self._groups)
        full_mask = valid = None
        if causal and pooled and key_mask is not None and key_mask.shape[1] > 1:
            # Row-dependent constraints: pool the merged (B, T, S) mask.
            full_mask = masks_lib.merge_masks(
                mask, masks_lib.causal_mask(num_queries, num_keys)
            )
        elif causal and pooled:
            # Causal windows from the keys' validity alone, O(T S / r).
            valid = masks_lib.causal_valid_keys(
                query_mask, key_mask, num_queries, num_keys
            )
        elif pooled and mask is not None:
            full_mask = mask
        outputs, scores = [], []
        for factor, heads in self._groups:
            group_mask, group_causal = mask, causal
            if factor > 1:
                group_mask, group_causal = None, False
                if full_mask is not None:
                    group_mask, valid = pooling.pool_mask(full_mask, factor, p)
            k, v, counts = self._group_keys(
                key, value, key_is_value, heads, factor, valid
            )
            if factor > 1 and full_mask is None and causal:
                group_mask = masks_lib.merge_masks(
                    rows,
                    pooling.causal_window_mask(
                        valid, counts, factor, p, num_queries, num_keys
                    ),
                )
            k = self._convolve(k, "key", causal)
            out, score = self._compute_attention(
                self._group_query(query, heads),
                k,
                v,
                group_mask,
                training,
                return_scores,
                use_causal_mask=group_causal,
            )
            outputs.append(out)
            if return_scores and factor > 1:
                score = pooling.spread_scores(
                    score, factor, p, counts, valid, num_keys
                )
            scores.append(score)
        return outputs, scores

    def _linear_heads(
        self,
        query,
        key,
        value,
        key_is_value,
        query_mask,
        key_padding,
        attention_mask,
        causal,
        return_scores,
    ):
        """Linear (and BN) attention of every group of heads, O(T + S)."""
        p = self._num_prefix_tokens
        num_queries, num_keys = query.shape[1], value.shape[1]
        if attention_mask is not None and attention_mask.shape[1] != 1:
            raise ValueError(
                "`attention_mask` must be a padding mask of shape (B, 1, S) "
                "under kernel='linear': linear attention supports padding "
                "and causal masks only (use `use_causal_mask=True`); an "
                "arbitrary (B, T, S) mask would make it quadratic. Received: "
                f"attention_mask.shape={tuple(attention_mask.shape)}"
            )
        key_mask = masks_lib.merge_masks(key_padding, attention_mask)
        if causal:
            valid = masks_lib.causal_valid_keys(
                query_mask, key_mask, num_queries, num_keys
            )
        else:
            valid = None if key_mask is None else key_mask[:, 0]
        outputs, scores = [], []
        for factor, heads in self._groups:
            k, v, counts = self._group_keys(
                key, value, key_is_value, heads, factor, valid
            )
            if factor == 1:
                weights, ready = valid, ops.ones((1, num_keys))
            else:
                weights = counts > 0
                ready = pooling.ready_positions(valid, factor, p, num_keys)
            k = self._convolve(k, "key", causal)
            visible = None
            if causal:
                visible = pooling.visible_counts(ready, num_queries)
            q, k = self._center_linear(
                self._group_query(query, heads), k, weights, visible
            )
            out, score = kernels.linear_attention(
                q,
                k,
                v,
                key_weights=weights,
                counts=visible,
                return_scores=return_scores,
            )
            outputs.append(out)
            if return_scores and factor > 1:
                score = pooling.spread_scores(
                    score, factor, p, counts, valid, num_keys
                )
            scores.append(score)
        if query_mask is not None:
            rows = ops.cast(query_mask, "bool")[:, :, None, None]
            outputs = [ops.where(rows, o, ops.zeros_like(o)) for o in outputs]
            if return_scores:
                rows = ops.cast(query_mask, "bool")[:, None, :, None]
                scores = [ops.where(rows, s, ops.zeros_like(s)) for s in scores]
        return outputs, scores

    def _center_linear(self, query, key, weights, visible):
        """Attention-BN under the linear kernel: shift q and k before Phi.

        Non-causal: both by beta mu over the valid keys. Causal: query i by
        the mean of the keys it sees, key j by the mean of keys 0..j (its
        own prefix), which keeps the prefix sums O(T).
        """
        if not self.uses_bn:
            return query, key
        beta = self._beta_value()
        if visible is None:
            moments = statistics.key_moments(
                key,
                None if weights is None else weights[:, None, :],
                with_variance=self._standardize,
            )
            key_moments = query_moments = (
                moments if self._standardize else (moments, None)
            )
        else:
            running = statistics.running_moments(
                key, weights, self._standardize
            )[:-1]
            key_moments = tuple(running) + (None,) * (2 - len(running))
            query_moments = tuple(
                None if m is None else kernels.gather_prefix(m, visible)
                for m in key_moments
            )
        return (
            statistics.normalize(
                query, query_moments[0], beta, query_moments[1], self._epsilon
            ),
            statistics.normalize(
                key, key_moments[0], beta, key_moments[1], self._epsilon
            ),
        )

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        """Attention of projected heads: BN recentering, then the kernel.

        Same hook and signature as `keras.layers.MultiHeadAttention`:
        query `(B, T, N, D)`, key `(B, S, N, D)`, value `(B, S, N, Dv)`,
        `attention_mask` broadcastable to `(B, T, S)`.
        """
        dtype = keras.backend.standardize_dtype(query.dtype)
        if self._standardize and dtype == "float16":
            # q / s^2 can exceed float16's range (s^2 ~ epsilon when a query
            # sees one key): attend in float32 and cast back.
            out, scores = self._compute_attention(
                *(ops.cast(t, "float32") for t in (query, key, value)),
                attention_mask,
                training,
                return_attention_scores,
                use_causal_mask=use_causal_mask,
            )
            scores = None if scores is None else ops.cast(scores, dtype)
            return ops.cast(out, dtype), scores
        if self.uses_bn:
            moments = statistics.key_moments(
                key,
                attention_mask,
                causal=use_causal_mask,
                num_queries=query.shape[1],
                with_variance=self._standardize,
            )
            mean, variance = moments if self._standardize else (moments, None)
            query = statistics.shift_query(
                query, mean, self._beta_value(), variance, self._epsilon
            )
        dropout = None
        if self._dropout > 0 and training:

            def dropout(w):
                return self._dropout_layer(w, training=training)

        return kernels.softmax_attention(
            query,
            key,
            value,
            mask=attention_mask,
            is_causal=use_causal_mask,
            scale=self._inverse_sqrt_key_dim,
            dropout=dropout,
            return_scores=return_attention_scores,
            flash_attention=self._flash_attention,
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
    ):
        output_shape = self.compute_output_shape(
            query.shape, value.shape, None if key is None else key.shape
        )
        output = keras.KerasTensor(output_shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        scores_shape = (
            query.shape[0],
            self._num_heads,
            query.shape[1],
            value.shape[1],
        )
        return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "attention_axes": None,  # build() fills in (1,)
                "flash_attention": self._flash_attention_arg,
                "beta": self._beta,
                "standardize": self._standardize,
                "learn_beta": self._learn_beta,
                "epsilon": self._epsilon,
                "head_factors": list(self._head_factors),
                "num_prefix_tokens": self._num_prefix_tokens,
                "kernel": self._kernel,
                "sparsity": self._sparsity,
                "block_size": self._block_size,
                "conv_kernel_size": self._conv_kernel_size,
                "conv_grid": self._conv_grid,
            }
        )
        return config


def _select_heads(x, heads, axis):
    """`x` restricted to `heads` along `axis`: a slice when they are
    contiguous (a gather's gradient is a scatter, slow on CPU and sparse on
    TensorFlow), a gather otherwise."""
    if list(heads) == list(range(heads[0], heads[-1] + 1)):
        index = [slice(None)] * len(x.shape)
        index[axis] = slice(heads[0], heads[-1] + 1)
        return x[tuple(index)]
    return ops.take(x, heads, axis=axis)
