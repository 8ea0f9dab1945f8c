"""SVRGroupedQueryAttention: grouped-query attention as SVR expansions."""

import keras
from keras import ops

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.functional import attention
from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional import visibility
from keras_svr_attention.layers import _common as common
from keras_svr_attention.layers import _validation as check


@svr_export
class SVRGroupedQueryAttention(keras.layers.GroupQueryAttention):
    """Grouped-query attention with Attention-BN and Attention-SH.

    A drop-in for `keras.layers.GroupQueryAttention`: the same constructor
    arguments, weights, call signature and masks; with every option off it
    computes what `GroupQueryAttention` computes (a query row that sees no
    key outputs zeros). K = `num_key_value_heads` key/value heads serve
    N = `num_query_heads` query heads, query head u using key/value head
    u // (N / K). The SVR options act per key/value head:

    ```text
    Attention-SH: key/value head g is average-pooled by head_factors[g]
      (Eqn 25), and its whole query group sees the pooled keys and values.
    Attention-BN: a query group recenters by b mu_i, the mean of the
      (pooled) keys of its key/value head that query i may see (Eqn 26;
      Eqn 22 with standardize).
    ```

    Masks, causality and windows follow `SVRAttention`'s rule (SPEC.md
    section 6): under `use_causal_mask` a pooled window is seen only by
    queries at or after the end of its span. The computation is
    `keras_svr_attention.svr_dot_product_attention`'s.

    `head_dim`, `num_query_heads`, `num_key_value_heads`, `dropout`,
    `use_bias`, `sliding_window`, `flash_attention`, `use_gate` and the
    initializers, regularizers and constraints are
    `GroupQueryAttention`'s. The SVR options:

    Args:
        beta: float or None. Recentering weight b; None or 0: off.
        standardize: bool. Also divide by the keys' standard deviation.
        learn_beta: bool. Learn b as one scalar, initialised at `beta`.
        epsilon: float > 0. Added to sigma^2 under `standardize`.
        head_factors: one int >= 1 per key/value head, or None (all 1).
        num_prefix_tokens: int. Leading tokens that are never pooled.
        kernel: "softmax" or "linear".

    Examples:
        >>> layer = SVRGroupedQueryAttention(
        ...     head_dim=8, num_query_heads=4, num_key_value_heads=2,
        ...     beta=1.0, head_factors=[1, 2])
        >>> x = keras.random.normal((2, 10, 16), seed=0)
        >>> tuple(layer(x, x, use_causal_mask=True).shape)
        (2, 10, 16)
    """

    def __init__(
        self,
        head_dim,
        num_query_heads,
        num_key_value_heads,
        beta=None,
        standardize=False,
        learn_beta=False,
        epsilon=1e-5,
        head_factors=None,
        num_prefix_tokens=0,
        kernel="softmax",
        **kwargs,
    ):
        check.positive_int("num_query_heads", num_query_heads)
        check.positive_int("num_key_value_heads", num_key_value_heads)
        check.positive_int("head_dim", head_dim)
        if num_query_heads % num_key_value_heads:
            raise ValueError(
                "`num_query_heads` must be divisible by `num_key_value_heads`"
                f". Received: num_query_heads={num_query_heads}, "
                f"num_key_value_heads={num_key_value_heads}"
            )
        super().__init__(
            int(head_dim), int(num_query_heads), int(num_key_value_heads),
            **kwargs,
        )  # fmt: skip
        self.options = check.svr_core_options(
            beta,
            standardize,
            learn_beta,
            epsilon,
            head_factors,
            self.num_key_value_heads,
            num_prefix_tokens,
            kernel,
            heads_name="num_key_value_heads",
        )

    @property
    def head_factors(self):
        return self.options.head_factors

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self.options.learn_beta:
            self.beta_weight = self.add_weight(
                name="beta",
                shape=(),
                initializer=keras.initializers.Constant(self.options.beta),
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
    ):
        self._return_attention_scores = return_attention_scores
        query, value, key, key_mask = common.consume_masks(
            query, value, key, query_mask, value_mask, key_mask
        )
        gate = self._gate_dense(query) if self.use_gate else None
        query = self._query_dense(query)
        key = ops.repeat(self._key_dense(key), self.num_repeats, axis=2)
        value = ops.repeat(self._value_dense(value), self.num_repeats, axis=2)
        num_queries = masks_lib.shape_of(query)[1]
        num_keys = masks_lib.shape_of(value)[1]
        plan = visibility.plan_head_groups(
            tuple(
                f
                for f in self.options.head_factors
                for _ in range(self.num_repeats)
            ),
            self.options.num_prefix_tokens,
            num_queries,
            num_keys,
            query_mask=query_mask,
            key_padding=masks_lib.merge_masks(value_mask, key_mask),
            attention_mask=visibility.attention_mask_4d(
                attention_mask,
                self.num_query_heads,
                (query.shape[0], query.shape[1], value.shape[1]),
            ),
            causal=use_causal_mask,
            sliding_window=self.sliding_window,
            kernel=self.options.kernel,
        )
        output, scores = attention.attend_groups(
            query,
            key,
            value,
            plan,
            lambda *group: self._attend_group(*group, training),
            self.options.num_prefix_tokens,
            return_attention_scores,
        )
        if gate is not None:
            output = ops.multiply(output, gate)
        output = self._output_dense(output)
        return (output, scores) if return_attention_scores else output

    def _attend_group(self, group, query, key, value, training):
        if self.options.kernel == "linear":
            return attention.linear_group(
                query,
                key,
                value,
                group.key_weights,
                group.visible,
                common.beta_value(self),
                self.options.standardize,
                self.options.epsilon,
                self._return_attention_scores,
            )
        fast = (
            group.causal_only
            and type(self)._compute_attention
            is SVRGroupedQueryAttention._compute_attention
        )
        mask = common.group_hook_mask(group, query, key, fast)
        return self._compute_attention(
            query,
            key,
            value,
            attention_mask=mask,
            training=training,
            **({"use_causal_mask": True} if fast else {}),
        )

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        use_causal_mask=False,
    ):
        """`GroupQueryAttention`'s hook, with Attention-BN: query
        `(B, T, n, H)`, key and value `(B, S', n, H)` of one head group
        (K/V already repeated to the query heads, keys pooled)."""
        if self._flash_attention and self._return_attention_scores:
            raise ValueError(
                "Returning attention scores is not supported when flash "
                "attention is enabled. Please disable flash attention to "
                "access attention scores."
            )
        attention_mask, causal_only = common.hook_causal_mask(
            attention_mask, use_causal_mask, query, key
        )
        return attention.softmax_group(
            query,
            key,
            value,
            attention_mask,
            causal_only,
            beta=common.beta_value(self),
            standardize=self.options.standardize,
            epsilon=self.options.epsilon,
            scale=self._inverse_sqrt_head_dim,
            dropout=common.dropout_fn(self, self.dropout, training),
            return_scores=self._return_attention_scores,
            flash_attention=self._flash_attention,
        )

    def get_config(self):
        return {
            **super().get_config(),
            **{
                name: value
                for name, value in self.options.get_config().items()
                if name in check.CORE_OPTIONS
            },
        }
