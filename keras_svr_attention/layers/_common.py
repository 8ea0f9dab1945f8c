"""What SVRAttention and SVRGroupedQueryAttention share around the
functional core: masks in, plan, the kernel through the layer's hooks."""

import keras
from keras import ops

from keras_svr_attention.functional import attention
from keras_svr_attention.functional import decoding
from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional import options as options_lib
from keras_svr_attention.functional import recurrent
from keras_svr_attention.functional import visibility
from keras_svr_attention.functional._tensors import shape_of


class SVRLayer:
    """Mixin of the SVR attention layers, put before the Keras class.

    The layer sets `options` (an `SVROptions`) and `_plan_options` (the
    same, with one head factor per query head) in `__init__`, calls
    `_build_beta` in `build`, and in `call` projects its heads and hands
    them to `_svr_attention`. The kernel hooks, `_compute_attention` and
    `_compute_linear_attention`, are defined here for both layers.
    """

    _HOOK_TAKES_SCORES = True  # MultiHeadAttention's hook signature
    _SCALE = "_inverse_sqrt_key_dim"  # the attribute holding 1 / sqrt(D)

    @property
    def head_factors(self):
        return self.options.head_factors

    @property
    def uses_bn(self):
        """Whether queries are recentered (beta, learn_beta or standardize)."""
        return self.options.uses_bn

    def _build_beta(self):
        if self.options.learn_beta:
            self.beta_weight = self.add_weight(
                name="beta",
                shape=(),
                initializer=keras.initializers.Constant(self.options.beta),
                trainable=True,
            )

    def _svr_attention(
        self, query, key, value, query_mask, key_padding, attention_mask,
        causal, training, return_scores, offset=0, pending=None,
        transform_key=None,
    ):  # fmt: skip
        """Plan, then attend through the hooks: projected heads
        `(B, T, N, D)`, `(B, S, N, D)`, `(B, S, N, Dv)` and the masks of
        `input_masks` -> `(output (B, T, N, Dv), scores or None)`.

        The kernel is chosen once: `_compute_linear_attention`, or
        `_compute_attention` with MultiHeadAttention's contract: the layer's
        own hook takes causality alone as `use_causal_mask=True` (a fused
        kernel's `is_causal`); an override gets the causal mask built
        instead, as under MultiHeadAttention, and masks of one head as
        `(B, T, S)`.
        """
        num_heads = query.shape[2]
        if attention_mask is not None:
            attention_mask = visibility.attention_mask_4d(
                attention_mask,
                num_heads,
                (query.shape[0], query.shape[1], value.shape[1]),
            )
        plan = visibility.plan_head_groups(
            self._plan_options,
            num_queries=shape_of(query)[1],
            num_keys=shape_of(value)[1],
            query_mask=query_mask,
            key_padding=key_padding,
            attention_mask=attention_mask,
            causal=causal,
            offset=offset,
            pending=pending,
        )
        own = type(self)._compute_attention is SVRLayer._compute_attention
        scores = {"return_attention_scores": return_scores}
        scores = scores if self._HOOK_TAKES_SCORES else {}

        def attend_linear(group, q, k, v):
            return self._compute_linear_attention(
                q, k, v,
                key_weights=group.key_weights,
                causal_prefix=group.causal_prefix,
                return_attention_scores=return_scores,
            )  # fmt: skip

        def attend(group, q, k, v):
            mask, causal = group.mask, group.causal
            if causal and not own:
                keys = masks_lib.causal_mask(shape_of(q)[1], shape_of(k)[1])
                mask, causal = keys[:, None], False
            if mask is not None and mask.shape[1] == 1:
                mask = mask[:, 0]  # (B, T, S), as MultiHeadAttention's hook
            causal = {"use_causal_mask": True} if causal else {}
            return self._compute_attention(
                q, k, v, mask, training, **scores, **causal
            )

        if self.options.kernel == "linear":
            attend = attend_linear
        return attention.svr_attention(
            query, key, value,
            plan=plan, attend=attend, return_scores=return_scores,
            transform_key=transform_key,
        )  # fmt: skip

    def get_initial_state(self, batch_size, max_length=None, packed=False):
        """The decoding state before any token: causal decoding as a Keras
        RNN cell decodes.

        `state = layer.get_initial_state(batch_size, max_length=...)`,
        then `y, state = layer(x, x, cache=state, use_causal_mask=True)`
        for a prompt of any length, then one token at a time or in pieces.
        The state is a dict of fixed shapes (`ops.while_loop`, `ops.scan`
        and `jit_compile` carry it), and the outputs equal the full causal
        forward's (the rules page, "Decoding state"):

        - softmax modes: per group of heads that share a head factor r,
          the keys and values of its completed windows, about
          max_length / r slots (`functional.decoding`), with Attention-BN's
          running sums;
        - `kernel="linear"`: the recurrent state, whose size does not grow
          with the tokens (`functional.recurrent`).

        Args:
            batch_size: int.
            max_length: int. The longest sequence the state will hold;
                needed by the softmax modes, ignored by the linear kernel.
            packed: bool. The state as one tensor, as a KerasHub causal
                LM carries a layer's cache: the linear state
                `(B, 2, R, num_heads, key_dim)`
                (`functional.recurrent.pack_state`), a softmax mode's
                `(B, 1, 1, X)` float32 (`functional.decoding.pack_state`).

        Returns:
            A dict of tensors, or the state packed.

        Examples:
            >>> from keras_svr_attention import SVRAttention
            >>> layer = SVRAttention(num_heads=2, key_dim=8,
            ...                      head_factors=[1, 4])
            >>> x = keras.random.normal((1, 5, 16), seed=0)
            >>> state = layer.get_initial_state(1, max_length=32)
            >>> y, state = layer(x, x, cache=state, use_causal_mask=True)
            >>> tuple(state["r4_keys"].shape)
            (1, 1, 8, 8)
        """
        self._check_state_options(max_length)
        options = self.options
        key_dim, value_dim = self._head_dims()
        if options.kernel == "linear":
            state = recurrent.initial_state(
                self._plan_options, batch_size, key_dim, value_dim
            )
        else:
            state = decoding.initial_state(
                options,
                batch_size,
                max_length=int(max_length),
                key_dim=key_dim,
                value_dim=value_dim,
                dtype=self.compute_dtype,
            )
        return self._pack_state(state) if packed else state

    def _check_state_options(self, max_length):
        """The options a decoding state refuses, as a ValueError; builds
        no tensor (a decoding call checks it at every step)."""
        options = self.options
        problem = None
        if options.conv_kernel_size:
            problem = (
                "no `conv_kernel_size`: the convolution of a key needs the "
                "tokens after it. Received: "
                f"conv_kernel_size={options.conv_kernel_size!r}"
            )
        elif options.sparsity:
            problem = (
                "no `sparsity`: decode a sparse pattern with a key/value "
                "cache of shape (B, 2, S, num_heads, key_dim) and "
                f"`cache_update_index`. Received: sparsity={options.sparsity!r}"
            )
        elif options.kernel == "softmax" and not (
            options_lib.is_int(max_length) and max_length > 0
        ):
            problem = (
                "`max_length`, a positive int, under kernel='softmax': the "
                "cache holds positions. Received: "
                f"max_length={max_length!r}"
            )
        if problem:
            raise ValueError(f"`get_initial_state` needs {problem}")

    def _pack_state(self, state):
        if self.options.kernel == "linear":
            return recurrent.pack_state(state)
        return decoding.pack_state(state)

    def _unpack_state(self, packed):
        """`get_initial_state(packed=True)`'s tensor -> the state dict."""
        key_dim, value_dim = self._head_dims()
        if self.options.kernel == "linear":
            return recurrent.unpack_state(packed, self._plan_options, key_dim)
        return decoding.unpack_state(
            packed, self.options, key_dim, value_dim, self.compute_dtype
        )

    def _check_state_call(
        self, query, value, attention_mask, return_scores, causal, index
    ):
        """A call with a decoding state: what it needs, or a ValueError."""
        problem = None
        if not causal:
            problem = "`use_causal_mask=True` (the state is causal)"
        elif index is not None:
            problem = "no `cache_update_index` (the state holds its position)"
        elif attention_mask is not None:
            problem = "no `attention_mask` (pass padding as `value_mask`)"
        elif return_scores:
            problem = "no `return_attention_scores` (a state pools its keys)"
        elif query.shape[1] != value.shape[1]:
            problem = "`query` and `value` of the same new tokens"
        if problem:
            raise ValueError(
                f"A decoding state as `cache` needs {problem}. Received: "
                f"use_causal_mask={causal}, cache_update_index={index!r}, "
                f"attention_mask="
                f"{None if attention_mask is None else 'given'}, "
                f"return_attention_scores={return_scores}, "
                f"query.shape={tuple(query.shape)}, "
                f"value.shape={tuple(value.shape)}"
            )
        self._check_state_options(max_length=1)

    def _decode_state(
        self, query, key, value, query_mask, key_padding, state, limit=None
    ):
        """Causal attention of the new tokens from a decoding state:
        projected heads -> `(output (B, T, N, Dv), new state)`
        (`functional.decoding.decode`, or for the linear kernel
        `functional.recurrent.linear_recurrence`, `limit` its own); padded
        queries output zeros."""
        beta = self.beta_weight if self.options.learn_beta else None
        if self.options.kernel == "linear":
            output, state = recurrent.linear_recurrence(
                query, key, value, state, self._plan_options,
                beta=beta, valid=key_padding, limit=limit,
            )  # fmt: skip
        else:
            output, state = decoding.decode(
                query, key, value, state, self.options,
                beta=beta, valid=key_padding, scale=getattr(self, self._SCALE),
                flash_attention=self._flash_attention, limit=limit,
            )  # fmt: skip
        if query_mask is not None:
            valid = ops.expand_dims(ops.cast(query_mask, "bool"), (2, 3))
            output = ops.where(valid, output, ops.zeros_like(output))
        return output, state

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
        """Softmax attention of one group of heads, with Attention-BN.

        The hook of `keras.layers.MultiHeadAttention`, with its signature
        (`GroupQueryAttention`'s takes no `return_attention_scores`: the
        call sets `_return_attention_scores`): query `(B, T, n, D)`, key
        `(B, S', n, D)`, value `(B, S', n, Dv)` (S' the pooled length of
        the group), `attention_mask` the group's finished mask,
        `(B|1, T|1, S')` or per head `(B|1, n, T|1, S')`, or None.
        `use_causal_mask=True` also applies j <= i, as in
        `MultiHeadAttention` (alone, a fused kernel takes it as
        `is_causal=True`). `functional.attention.softmax_group`.
        """
        return_scores = return_attention_scores or getattr(
            self, "_return_attention_scores", False
        )
        if self._flash_attention and return_scores:
            self._refuse_scores_under_flash()
        dropout = None
        if self.dropout and training:

            def dropout(weights):
                return self._dropout_layer(weights, training=training)

        beta = self.beta_weight if self.options.learn_beta else None
        return attention.softmax_group(
            query, key, value, attention_mask,
            is_causal=use_causal_mask, options=self.options, beta=beta,
            scale=getattr(self, self._SCALE), dropout=dropout,
            return_scores=return_scores,
            flash_attention=self._flash_attention,
        )  # fmt: skip

    def _refuse_scores_under_flash(self):
        raise ValueError(
            "Returning attention scores is not supported when flash "
            "attention is enabled. Please disable flash attention to "
            "access attention scores (`return_attention_scores=True`). "
            f"Received: flash_attention={self.options.flash_attention!r}, "
            f"in effect {self._flash_attention!r} (None follows "
            "keras.config.enable_flash_attention())"
        )

    def _compute_linear_attention(
        self,
        query,
        key,
        value,
        key_weights=None,
        causal_prefix=None,
        return_attention_scores=False,
    ):
        """Linear attention of one group of heads, with Attention-BN.

        The counterpart of `_compute_attention` for `kernel="linear"`:
        query `(B, T, n, D)`, key `(B, S', n, D)`, value `(B, S', n, Dv)`;
        `key_weights` `(B|1, S')` marks valid keys and `causal_prefix`
        `(B|1, T)` holds the causal prefix lengths (None when not causal).
        `functional.attention.linear_group`.
        """
        group = visibility.HeadGroup(
            1, (), key_weights=key_weights, causal_prefix=causal_prefix
        )
        beta = self.beta_weight if self.options.learn_beta else None
        return attention.linear_group(
            query, key, value,
            group=group, options=self.options, beta=beta,
            return_scores=return_attention_scores,
        )  # fmt: skip


def state_spec(state):
    """The specs of a decoding state after a call: its own shapes."""
    return {
        name: keras.KerasTensor(tensor.shape, dtype=tensor.dtype)
        for name, tensor in state.items()
    }


def input_masks(query, value, key, query_mask, value_mask, key_mask):
    """`(query, value, key, query_mask, key_padding)` ready to project.

    `key` defaults to `value` (its mask then ignored, as in
    MultiHeadAttention). Tensors whose Keras masks are consumed here are
    copied, since a sublayer given a tensor with a Keras mask attached
    warns that it drops it. The `(B, T)` query padding is checked, and the
    `(B, S)` value and key padding checked and merged (None without
    masks). Raises a ValueError naming the mask
    whose known sizes do not fit.
    """
    key_is_value = key is None or key is value
    key = value if key is None else key
    key_mask = None if key_is_value else key_mask
    if query_mask is not None:
        query = ops.copy(query)
    if value_mask is not None or key_mask is not None:
        value = ops.copy(value)
        key = value if key_is_value else ops.copy(key)
    (batch, num_queries), num_keys = query.shape[:2], value.shape[1]
    for name, mask, length, axis_name in (
        ("query_mask", query_mask, num_queries, "T"),
        ("value_mask", value_mask, num_keys, "S"),
        ("key_mask", key_mask, num_keys, "S"),
    ):
        if mask is None:
            continue
        if not visibility.fits(mask.shape, (batch, length)):
            raise ValueError(
                f"`{name}` must have shape (B, {axis_name}) = "
                f"{(batch, length)}. Received: {name}.shape="
                f"{tuple(mask.shape)}"
            )
    key_padding = masks_lib.merge_masks(value_mask, key_mask)
    return query, value, key, query_mask, key_padding
