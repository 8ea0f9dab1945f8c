"""SVRGroupedQueryAttention: grouped-query attention as SVR expansions."""

import keras
from keras import ops

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.functional import options as options_lib
from keras_svr_attention.layers import _common as common


@svr_export
class SVRGroupedQueryAttention(
    common.SVRLayer, keras.layers.GroupQueryAttention
):
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

    Masks, causality and windows follow `SVRAttention`'s rule (the rules
    page, "Visibility" and "Causal windows"): under `use_causal_mask` a
    pooled window is seen only by queries at or after the end of its span.
    The forward is `SVRAttention`'s: K/V repeated to the query heads, then
    the same plan and kernels (the rules page, "Grouped-query attention").

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
        chunk_size: int > 0. Chunk of the causal linear kernel's
            recurrence (`SVRAttention`).

    `call` also takes `cache`, a decoding state of
    `get_initial_state(batch_size, max_length)` kept per key/value head,
    and then returns `(output, new state)` (the decoding page).

    Examples:
        >>> layer = SVRGroupedQueryAttention(
        ...     head_dim=8, num_query_heads=4, num_key_value_heads=2,
        ...     beta=1.0, head_factors=[1, 2])
        >>> x = keras.random.normal((2, 10, 16), seed=0)
        >>> tuple(layer(x, x, use_causal_mask=True).shape)
        (2, 10, 16)
    """

    _HOOK_TAKES_SCORES = False  # GroupQueryAttention's hook signature
    _SCALE = "_inverse_sqrt_head_dim"

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
        chunk_size=64,
        **kwargs,
    ):
        for name, value in (
            ("num_query_heads", num_query_heads),
            ("num_key_value_heads", num_key_value_heads),
            ("head_dim", head_dim),
        ):
            options_lib.positive_int(name, value)
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
        self.options = options_lib.svr_options(
            self.num_key_value_heads,
            beta=beta, standardize=standardize, learn_beta=learn_beta,
            epsilon=epsilon, head_factors=head_factors,
            num_prefix_tokens=num_prefix_tokens, kernel=kernel,
            chunk_size=chunk_size, heads_name="num_key_value_heads",
            sliding_window=self.sliding_window,
        )  # fmt: skip
        self._plan_options = self.options.per_query_head(self.num_repeats)

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        self._build_beta()

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
    ):
        self._return_attention_scores = return_attention_scores
        query, value, key, query_mask, key_padding = common.input_masks(
            query, value, key,
            query_mask=query_mask, value_mask=value_mask, key_mask=key_mask,
        )  # fmt: skip
        gate = self._gate_dense(query) if self.use_gate else None
        query = self._query_dense(query)
        key, value = self._key_dense(key), self._value_dense(value)
        if cache is not None:
            if not isinstance(cache, dict):
                raise ValueError(
                    "`cache` must be a decoding state, the dict of "
                    "`get_initial_state(batch_size, max_length)`. Received: "
                    f"cache of type {type(cache).__name__}"
                )
            self._check_state_call(
                query, value,
                attention_mask=attention_mask,
                return_scores=return_attention_scores,
                causal=use_causal_mask, index=None,
            )  # fmt: skip
            output, cache = self._decode_state(
                query, key, value,
                query_mask=query_mask, key_padding=key_padding, state=cache,
            )  # fmt: skip
        else:
            key, value = (
                ops.repeat(x, self.num_repeats, axis=2) for x in (key, value)
            )
            output, scores = self._svr_attention(
                query, key, value,
                query_mask=query_mask, key_padding=key_padding,
                attention_mask=attention_mask, causal=use_causal_mask,
                training=training, return_scores=return_attention_scores,
            )  # fmt: skip
        if gate is not None:
            output = ops.multiply(output, gate)
        output = self._output_dense(output)
        if cache is not None:
            return output, cache
        return (output, scores) if return_attention_scores else output

    def compute_output_spec(self, query, value, key=None, **kwargs):
        cache = kwargs.pop("cache", None)
        output = super().compute_output_spec(query, value, key, **kwargs)
        if cache is None:
            return output
        return output, common.state_spec(cache)

    def _head_dims(self):
        return self.head_dim, self.head_dim

    def get_config(self):
        config = self.options.get_config()
        return {
            **super().get_config(),
            **{name: config[name] for name in options_lib.CORE_OPTIONS},
        }
