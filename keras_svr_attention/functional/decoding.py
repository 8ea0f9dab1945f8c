"""Causal softmax decoding from a state of fixed shapes: each group of heads
keeps the smallest exact cache its math allows (the rules page,
"Decoding state").

A head pooled by r only ever reads completed windows: under causality
query t sees window w once its whole span has ended (the rules page,
"Causal windows"). Its state, per group of heads that share r, holds:

- `keys`, `values` `(B, n, C, D)`: the keys and values laid so far, one
  slot per pooled key (prefix token j in slot j, window w in slot p + w);
  C is `capacity(max_length, r, p)`, about p + (max_length - p) / r;
- `valid` `(B, C)`: whether a slot holds a key (a window with a valid
  token, a valid prefix token);
- `window_keys`, `window_values`, `window_count` (r > 1): the sums of the
  window still open, as the linear state keeps them
  (`recurrent.lay_new_tokens`);
- with a sliding window and r > 1, `first` `(B, C)` and `window_first`:
  the position of each window's first valid token, which says whether
  the band covers the whole window;
- under Attention-BN without a sliding window, `shift`, `key_count`,
  `key_sum` (and `key_square`): the running sums behind mu_t over the
  keys query t sees, so that a step does not reduce over the cache again.
  Under a sliding window mu_t is over the band's keys, reduced from the
  cache as the full forward does.

An unpooled group is a key/value cache of `max_length` slots. A call with
T new tokens at positions `position .. position + T - 1` lays them on
positions, writes the slots whose span ends in the call with one
`slice_update`, and attends over the slots with the causal rule. Its
outputs equal the full causal forward's at the same positions.

Grouped-query attention keeps one state per key/value head: the query
heads of a key/value head attend to its slots as extra query rows, so no
slot is repeated.
"""

import functools
import math

import keras
from keras import ops

from keras_svr_attention.functional import kernels
from keras_svr_attention.functional import pooling
from keras_svr_attention.functional import recurrent
from keras_svr_attention.functional import statistics
from keras_svr_attention.functional import visibility
from keras_svr_attention.functional._tensors import as_dtype
from keras_svr_attention.functional._tensors import positions
from keras_svr_attention.functional._tensors import shape_of


def write_key_value_cache(cache, index, key, value):
    """A key/value cache `(B, 2, S, N, H)` (KerasHub's layout) with `key`
    and `value` `(B, T, N, H)` written from position `index`:
    `(keys, values, cache)`, the keys and values of every slot."""
    start = [0, index, 0, 0]
    key = ops.slice_update(cache[:, 0], start, key)
    value = ops.slice_update(cache[:, 1], start, value)
    return key, value, ops.stack((key, value), axis=1)


def head_groups(options):
    """`[(factor, heads)]`: the heads of each distinct factor, in order of
    first appearance (as `visibility.plan_head_groups` groups them)."""
    groups = {}
    for head, factor in enumerate(options.head_factors):
        groups.setdefault(factor, []).append(head)
    return list(groups.items())


def capacity(max_length, factor, num_prefix_tokens=0):
    """Slots of a group's cache: `max_length` unpooled; pooled by r,
    p + ceil((max_length - p) / r), plus 2 p spare slots that a call's
    write may reach past the last window (p = 0: none)."""
    if factor == 1:
        return max_length
    p = num_prefix_tokens
    return 3 * p + math.ceil(max(max_length - p, 0) / factor)


def _new_slots(num_new, factor, num_prefix_tokens):
    """How many slots a call of `num_new` tokens (an int, or a scalar
    tensor at a symbolic length) may write, at most."""
    if factor == 1:
        return num_new
    if isinstance(num_new, int):
        return min(num_new, num_prefix_tokens) + math.ceil(num_new / factor)
    windows = ops.floor_divide(num_new + factor - 1, factor)
    return ops.minimum(num_new, num_prefix_tokens) + windows


def initial_state(options, batch_size, max_length, key_dim, value_dim, dtype):
    """The state before any token: a dict of zeros (the module docstring).

    Args:
        options: `SVROptions`, one head factor per key/value head.
        batch_size: int.
        max_length: int. The longest sequence the state will hold.
        key_dim: int, the head dimension of keys.
        value_dim: int, the head dimension of values.
        dtype: the dtype of the cached keys and values (the layer's
            compute dtype); sums are float32.

    Returns:
        `{"position": (B,) int32, "r<factor>_<entry>": ...}`.
    """
    layout = _layout(options, max_length, key_dim, value_dim, dtype)
    return {
        name: ops.zeros((batch_size, *shape), entry_dtype)
        for name, (shape, entry_dtype) in layout.items()
    }


def _layout(options, max_length, key_dim, value_dim, dtype):
    """`{name: (shape without the batch, dtype)}` of `initial_state`."""
    p = options.num_prefix_tokens
    layout = {"position": ((), "int32")}
    for factor, heads in head_groups(options):
        size = capacity(max_length, factor, p)
        n = len(heads)
        shapes = {
            "keys": ((n, size, key_dim), dtype),
            "values": ((n, size, value_dim), dtype),
            "valid": ((size,), "bool"),
        }
        if factor > 1:
            shapes.update(
                window_keys=((n, key_dim), "float32"),
                window_values=((n, value_dim), "float32"),
                window_count=((n,), "int32"),
            )
            if options.sliding_window is not None:
                shapes["first"] = ((size,), "int32")
                shapes["window_first"] = ((n,), "int32")
        if options.uses_bn and options.sliding_window is None:
            shapes.update(
                shift=((n, key_dim), "float32"),
                key_count=((n,), "int32"),
                key_sum=((n, key_dim), "float32"),
            )
            if options.standardize:
                shapes["key_square"] = ((n, key_dim), "float32")
        layout.update({f"r{factor}_{k}": v for k, v in shapes.items()})
    return layout


def pack_state(state, size=None):
    """The state as one float32 tensor `(B, 1, 1, X)`, for cache plumbing
    that passes one tensor per layer (KerasHub's `call_with_cache` stacks
    and slices them, and its decoders read the cache's axis 2 as the
    length of the mask they build, here 1): the entries flattened, in the
    order of their names, then zeros up to `size` numbers if given (the
    size shared by layers whose states differ: a band on some layers
    only). Keys and values in float16 or bfloat16, counts and positions
    below 2^24 are exact in float32."""
    batch = shape_of(state["position"])[0]
    flat = [
        ops.reshape(ops.cast(state[name], "float32"), (batch, -1))
        for name in sorted(state)
    ]
    flat = ops.concatenate(flat, axis=1)
    if size is not None and size > flat.shape[1]:
        flat = ops.pad(flat, [(0, 0), (0, size - flat.shape[1])])
    return flat[:, None, None]


def unpack_state(packed, options, key_dim, value_dim, dtype, max_length=None):
    """`pack_state`'s tensor -> the state dict of `options`; the
    `max_length` it was made for is read from its size, unless given (a
    state padded to a size shared with other layers')."""
    dtype = keras.backend.standardize_dtype(dtype)
    if max_length is None:
        layout = _packed_layout(
            packed.shape[-1], options, key_dim, value_dim, dtype
        )
    else:
        layout = _layout(options, max_length, key_dim, value_dim, dtype)
    flat, start, state = packed[:, 0, 0], 0, {}
    for name in sorted(layout):
        shape, entry_dtype = layout[name]
        size = math.prod(shape)
        entry = ops.reshape(flat[:, start : start + size], (-1, *shape))
        start += size
        if entry_dtype == "bool":
            entry = ops.greater(entry, 0.5)
        elif entry_dtype == "int32":
            entry = ops.cast(ops.round(entry), "int32")
        state[name] = as_dtype(entry, entry_dtype)
    return state


@functools.lru_cache(maxsize=256)
def _packed_layout(size, options, key_dim, value_dim, dtype):
    """The layout whose entries add up to `size` numbers per row: the
    smallest `max_length` that reaches it (each entry grows with it, so
    every `max_length` of that size lays the same shapes)."""

    def numbers(max_length):
        layout = _layout(options, max_length, key_dim, value_dim, dtype)
        return layout, sum(math.prod(s) for s, _ in layout.values())

    low, high = 1, 2**31
    while low < high:
        middle = (low + high) // 2
        if numbers(middle)[1] < size:
            low = middle + 1
        else:
            high = middle
    layout, found = numbers(low)
    if found != size:
        raise ValueError(
            f"A packed decoding state of {size} numbers per row does not "
            f"fit the layer's options (head_factors="
            f"{list(options.head_factors)}, key_dim={key_dim}, "
            f"value_dim={value_dim}); it was packed for another layer."
        )
    return layout


def state_bytes(state):
    """The bytes a state carries."""
    return sum(
        math.prod(tensor.shape) * _itemsize(tensor.dtype)
        for tensor in state.values()
    )


def _itemsize(dtype):
    dtype = keras.backend.standardize_dtype(dtype)
    return {"bool": 1, "float16": 2, "bfloat16": 2, "float64": 8}.get(dtype, 4)


def decode(
    query, key, value, state, options, beta=None, valid=None, scale=None,
    flash_attention=None, limit=None, sinks=None, slopes=None,
):  # fmt: skip
    """Causal softmax attention of T new tokens from `state`.

    Args:
        query: `(B, T, N, D)`, the projected query heads; N is a multiple
            of the K key/value heads (grouped-query attention: query head
            u reads key/value head u // (N / K)).
        key: `(B, T, K, D)`. value: `(B, T, K, Dv)`.
        state: `initial_state(...)` or a state this returned.
        options: `SVROptions` with one head factor per key/value head.
        beta: b, a float or scalar tensor, or None for `options.beta`.
        valid: `(B, T)` boolean key padding of the new tokens, or None.
        scale: float, the logits' scale (default 1 / sqrt(D)).
        flash_attention: passed to `keras.ops.dot_product_attention`.
        limit: int scalar tensor, or None. Only the tokens at positions
            < `limit` enter the state (`recurrent.limited`).
        sinks: `(N,)` attention sink logits, one per query head, or None
            (`kernels.softmax_attention`; under BN the row term that no
            longer cancels joins them, as in the full forward).
        slopes: `(N,)` ALiBi slopes m_u, one per query head, or None: the
            logit of slot c gains m_u pos(c), its window's mean position
            (the full forward's pooled bias, less a constant per row).
            Without prefix tokens.

    Returns:
        `(output (B, T, N, Dv) in value.dtype, new state)`.
    """
    num_kv_heads, num_heads = key.shape[2], query.shape[2]
    repeats = num_heads // num_kv_heads
    if options.uses_bn:
        beta = (options.beta or 0.0) if beta is None else beta
    start = state["position"][:1]  # every row stands at the same position
    taken, valid = recurrent.limited(valid, start, shape_of(query)[1], limit)
    call = (start, taken, beta, scale, flash_attention, repeats)
    if sinks is not None:
        sinks = ops.cast(sinks, "float32")
    if slopes is not None:
        slopes = ops.convert_to_tensor(slopes, "float32")
    if slopes is not None and options.num_prefix_tokens:
        raise ValueError(
            "ALiBi `slopes` in a decoding state take no prefix tokens. "
            f"Received: num_prefix_tokens={options.num_prefix_tokens}"
        )
    outputs, new_state, order = [], {}, []
    for factor, heads in head_groups(options):
        tag = f"r{factor}_"
        group = {
            name[len(tag) :]: _inside(name[len(tag) :], tensor)
            for name, tensor in state.items()
            if name.startswith(tag)
        }
        query_heads = [h * repeats + m for h in heads for m in range(repeats)]
        q = visibility.select_heads(query, query_heads, num_heads, 2)
        k, v = (
            visibility.select_heads(x, heads, num_kv_heads, 2)
            for x in (key, value)
        )
        group_sinks, group_slopes = (
            visibility.select_heads(x, query_heads, num_heads, 0)
            for x in (sinks, slopes)
        )
        out, group = _group_step(
            q, k, v, valid,
            state=group, factor=factor, options=options, call=call,
            sinks=group_sinks, slopes=group_slopes,
        )  # fmt: skip
        outputs.append(out)
        new_state.update(
            {tag + name: _outside(name, t) for name, t in group.items()}
        )
        order += query_heads
    inverse = [order.index(h) for h in range(num_heads)]
    output = outputs[0] if len(outputs) == 1 else ops.concatenate(outputs, 2)
    output = visibility.select_heads(output, inverse, num_heads, 2)
    new_state["position"] = state["position"] + taken
    dtype = keras.backend.standardize_dtype(value.dtype)
    return as_dtype(output, dtype), new_state


_COUNTS = ("window_count", "key_count", "window_first")
"""Entries kept as int32: exact at any length and left alone by a Keras
layer's autocast of floating inputs to its compute dtype."""


def _inside(name, tensor):
    """A state entry as the step computes with it: sums and counts in
    float32 (a float16 layer's call hands them in as float16), cached keys
    and values as they are."""
    if name in ("keys", "values", "valid", "first"):
        return tensor
    return as_dtype(tensor, "float32")


def _outside(name, tensor):
    """A state entry as the state keeps it (`_COUNTS` as int32)."""
    if name in _COUNTS:
        return ops.cast(ops.round(tensor), "int32")
    return tensor


def _group_step(
    query, key, value, valid, state, factor, options, call, sinks=None,
    slopes=None,
):  # fmt: skip
    """One group of key/value heads sharing `factor`: lay the new tokens,
    write the slots that end in this call, attend over the slots.
    `call` is `(start (1,), taken, beta, scale, flash_attention,
    repeats)`, `taken` how many new tokens enter the state; `sinks` and
    `slopes` the group's query heads' sink logits and ALiBi slopes
    `(n r,)`, or None."""
    start, taken, beta, scale, flash_attention, repeats = call
    num_new = shape_of(query)[1]
    p = options.num_prefix_tokens
    laid, window = recurrent.lay_new_tokens(
        key, value, valid,
        state=state, factor=factor, num_prefix_tokens=p, span=(start, taken),
    )  # fmt: skip
    new = dict(state, **window)
    at = dict(factor=factor, p=p, start=start[0], num_new=num_new)
    new.update(_write(state, laid, **at))
    mask = _visible(new, sliding_window=options.sliding_window, **at)
    # Heads first in the state: what a fused kernel takes without a copy.
    keys, values = (
        ops.transpose(new[name], (0, 2, 1, 3)) for name in ("keys", "values")
    )
    dtype = keras.backend.standardize_dtype(keys.dtype)
    if options.uses_bn:
        if options.sliding_window is None:
            mean, variance, sums = recurrent.prefix_moments(
                laid["keys"], laid["weights"],
                state=state, factor=factor, options=options, start=start,
            )  # fmt: skip
            new.update(sums)
        else:
            moments = statistics.key_moments(
                keys, mask[:, None], options.standardize
            )
            mean, variance = moments if options.standardize else (moments, None)
        if repeats > 1:
            mean, variance = (
                None if m is None else ops.repeat(m, repeats, axis=2)
                for m in (mean, variance)
            )
        if options.standardize and dtype == "float16":
            # q / sigma^2 may overflow float16: attend in float32.
            query, keys, values = (
                ops.cast(x, "float32") for x in (query, keys, values)
            )
        query = statistics.recenter_query(
            query, None, beta, options, with_offset=sinks is not None,
            moments=(mean, variance),
        )  # fmt: skip
        if sinks is not None:  # the row term that a sink does not cancel
            query, offset = query
            row_scale = query.shape[-1] ** -0.5 if scale is None else scale
            sinks = sinks + offset * row_scale  # (B, T, n r)
    out = _attend(
        query, keys, values, mask, repeats,
        scale=scale, flash_attention=flash_attention,
        soft_cap=options.logit_soft_cap, sinks=sinks,
        bias=None if slopes is None else _slot_bias(slopes, keys, factor),
    )  # fmt: skip
    return out, new


def _slot_bias(slopes, keys, factor):
    """ALiBi's `(n r, C)` logit bias m_u pos(c) over the slots of keys
    `(B, C, n, D)`: slot c is window c (no prefix tokens), at its centre
    c r + (r - 1) / 2; `slopes` float32."""
    slots = shape_of(keys)[1]
    centre = ops.arange(slots, dtype="float32") * factor + (factor - 1) / 2
    return slopes[:, None] * centre


def _visible(state, factor, p, start, num_new, sliding_window):
    """`(B, T, C)`: the slots that new token t sees. A slot is written
    when its span ends, so a single new token sees every written one;
    several see those that end at or before their positions. A sliding
    window w also asks that each of the slot's valid tokens be within w
    (its first one, `first`, for a window)."""
    mask = state["valid"][:, None, :]
    num_slots = state["keys"].shape[2]
    rows = start + positions(num_new)  # (T,) positions of the new tokens
    ends = None
    if factor == 1 or not (isinstance(num_new, int) and num_new == 1):
        ends = pooling.span_ends(positions(num_slots), factor, p)
    if not (isinstance(num_new, int) and num_new == 1):
        mask = ops.logical_and(mask, (ends[None, :] <= rows[:, None])[None])
    if sliding_window is not None:
        first = state["first"] if factor > 1 else ends[None]
        band = first[:, None, :] > (rows - sliding_window)[None, :, None]
        mask = ops.logical_and(mask, band)
    return mask


_SELECT_WRITES = keras.config.backend() == "torch"
"""Whether a step writes its slot of the keys and values with a `where`:
torch's `slice_update` at a tensor index clones the cache and scatters
through index grids (a dozen ops, each a dispatch in eager torch); XLA's
dynamic update slice writes in place in a loop that donates its carry."""


def _write(state, laid, factor, p, start, num_new):
    """The slots of the keys whose span ends among the new tokens, written
    with one `slice_update` from the slot of position `start` (one new
    token: its slot selected with a `where` on the flags, and on torch on
    the keys and values too, `_SELECT_WRITES`)."""
    count = _new_slots(num_new, factor, p)
    first_slot = pooling.span_of(start, factor, p)
    if factor == 1 or (isinstance(num_new, int) and num_new == 1):
        # The new tokens' own slots; one token writes the slot of its
        # span, weight 0 unless the span ends there (`lay_new_tokens`).
        count = num_new
        block = {
            name: laid[name]
            for name in ("keys", "values", "weights", "first")
            if name in laid
        }
    else:
        slots = first_slot + positions(count)
        local = pooling.span_ends(slots, factor, p) - start
        inside = ops.cast(
            ops.logical_and(local >= 0, local < num_new), "float32"
        )
        index = ops.clip(local, 0, num_new - 1)
        block = {
            name: ops.take(laid[name], index, axis=1)
            for name in ("keys", "values", "weights", "first")
            if name in laid
        }
        block["weights"] = block["weights"] * inside[None]
    batch = ops.shape(state["valid"])[0]
    written = {
        "keys": ops.transpose(block["keys"], (0, 2, 1, 3)),
        "values": ops.transpose(block["values"], (0, 2, 1, 3)),
        "valid": ops.broadcast_to(block["weights"] > 0, (batch, count)),
    }
    if "first" in state:
        written["first"] = ops.cast(ops.round(block["first"]), "int32")
    one = isinstance(num_new, int) and num_new == 1
    # Slots are axis 1 of `valid` and `first`, axis 2 of the heads.
    first_slot = ops.cast(ops.reshape(first_slot, (1,)), "int32")
    if one:  # one slot, selected: (C,) and (C, 1) against the heads
        hit = positions(state["valid"].shape[1]) == first_slot
    if not (one and _SELECT_WRITES):  # each write's start, one tensor
        zero = ops.zeros_like(first_slot)
        flat_at = ops.concatenate([zero, first_slot])
        heads_at = ops.concatenate([zero, zero, first_slot, zero])
    new = {}
    for name, tensor in written.items():
        target = state[name]
        tensor = as_dtype(tensor, keras.backend.standardize_dtype(target.dtype))
        flat = len(target.shape) == 2
        if one and (flat or _SELECT_WRITES):
            new[name] = ops.where(hit if flat else hit[:, None], tensor, target)
        else:
            new[name] = ops.slice_update(
                target, flat_at if flat else heads_at, tensor
            )
    return new


def _attend(
    query, keys, values, mask, repeats, scale, flash_attention, soft_cap,
    sinks, bias,
):  # fmt: skip
    """Softmax attention of the group's query heads over its slots, its
    logits capped by `soft_cap` (or None), each row's denominator holding
    its query head's sink (`sinks` `(B|1, T|1, n r)`, or None), `bias`
    `(n r, C)` added to its query head's logits (or None); the `repeats`
    query heads of a key/value head become query rows (`_as_rows`)."""
    batch, num_new, num_heads, _ = shape_of(query)
    if sinks is not None:  # (B, n, T r, 1), heads before rows
        sinks = ops.broadcast_to(sinks, (batch, num_new, num_heads))
        sinks = _as_rows(sinks[..., None], repeats)
        sinks = ops.transpose(sinks, (0, 2, 1, 3))
    if bias is not None:  # (1, n, T r, C)
        bias = ops.broadcast_to(bias[None, None], (1, num_new, *shape_of(bias)))
        bias = ops.transpose(_as_rows(bias, repeats), (0, 2, 1, 3))
    if repeats > 1:
        mask = ops.repeat(mask, repeats, axis=1)
    out, _ = kernels.softmax_attention(
        _as_rows(query, repeats), keys, values, mask[:, None], scale=scale,
        flash_attention=flash_attention, soft_cap=soft_cap, sinks=sinks,
        bias=bias,
    )  # fmt: skip
    return _as_rows(out, repeats, inverse=True)


def _as_rows(x, repeats, inverse=False):
    """`(B, T, n r, F)` -> `(B, T r, n, F)`: the r query heads of each
    key/value head laid as query rows t r + m (no copy when r = 1);
    `inverse` the way back."""
    if repeats == 1:
        return x
    batch, rows, heads, features = shape_of(x)
    if inverse:  # (B, T r, n, F) -> (B, T, r, n, F) -> (B, T, n r, F)
        x = ops.reshape(x, (batch, -1, repeats, heads, features))
        x = ops.transpose(x, (0, 1, 3, 2, 4))
        return ops.reshape(x, (batch, -1, heads * repeats, features))
    x = ops.reshape(x, (batch, rows, -1, repeats, features))
    x = ops.transpose(x, (0, 1, 3, 2, 4))  # (B, T, r, n, F)
    return ops.reshape(x, (batch, rows * repeats, -1, features))
