"""Causal linear attention as a recurrence: a decoding state whose size
does not grow with the tokens seen (the rules page, "Linear state").

Under causality the linear kernel is a running sum (Katharopoulos et al.
2020, "Transformers are RNNs"):

```text
S_t = S_{t-1} + Phi(k'_t) v_t^T        z_t = z_{t-1} + Phi(k'_t)
h_t = Phi(q'_t)^T S_t / Phi(q'_t)^T z_t
```

and each option keeps that form exactly, with a few more running sums:

- SH: a pooled window enters S and z at the position where its span ends
  (the rules page, "Causal windows"); until then its valid tokens' sums
  wait in `window_keys`, `window_values` and `window_count`.
- BN: key j is shifted by the mean of the (pooled) keys 0..j, its own
  prefix, and query t by the mean of the keys it sees; both are running
  means (`key_sum`, `key_count`, and `key_square` under `standardize`), so
  Phi(k'_j) never changes once j is in S. The rule that would recenter
  every key by each query's mean (Phi(k_j - b mu_t)) has no finite state;
  ours is the rule of the full forward, so the state reproduces it.

A call takes the T new tokens at positions `position .. position + T - 1`
at once: the new keys are laid on those positions (pooled windows at their
ends, continuing the pending window) and `kernels.causal_linear_attention`
runs the chunked recurrence from the state.
"""

from keras import ops

from keras_svr_attention.functional import kernels
from keras_svr_attention.functional import statistics
from keras_svr_attention.functional import visibility
from keras_svr_attention.functional._tensors import as_dtype
from keras_svr_attention.functional._tensors import floor_mod
from keras_svr_attention.functional._tensors import positions
from keras_svr_attention.functional._tensors import shape_of
from keras_svr_attention.functional._tensors import zero_pad

ORDER = (
    "position", "kv", "z", "window_keys", "window_values", "window_count",
    "shift", "key_count", "key_sum", "key_square",
)  # fmt: skip
"""The entries of a state, in the order `pack_state` lays them."""


def initial_state(options, batch_size, key_dim, value_dim):
    """The state before any token: a dict of zeros.

    Entries (N = `len(options.head_factors)` heads, float32):
    `position` `(B,)` int32, the tokens seen; `kv` `(B, N, D, Dv)` and `z`
    `(B, N, D)`, S and z; with pooled heads `window_keys` `(B, N, D)`,
    `window_values` `(B, N, Dv)`, `window_count` `(B, N)`, the window
    still open; under BN `shift` (the first key), `key_count`, `key_sum`
    and, with `standardize`, `key_square`.
    """
    heads = len(options.head_factors)
    sizes = {
        "kv": (heads, key_dim, value_dim),
        "z": (heads, key_dim),
    }
    if max(options.head_factors) > 1:
        sizes.update(
            window_keys=(heads, key_dim),
            window_values=(heads, value_dim),
            window_count=(heads,),
        )
    if options.uses_bn:
        sizes.update(
            shift=(heads, key_dim), key_count=(heads,), key_sum=(heads, key_dim)
        )
        if options.standardize:
            sizes["key_square"] = (heads, key_dim)
    state = {"position": ops.zeros((batch_size,), "int32")}
    for name, shape in sizes.items():
        state[name] = ops.zeros((batch_size, *shape), "float32")
    return state


def linear_recurrence(
    query, key, value, state, options, beta=None, valid=None, limit=None
):
    """Causal linear attention of T new tokens from `state`.

    Args:
        query: `(B, T, N, D)`. key: `(B, T, K, D)`. value: `(B, T, K, Dv)`:
            the projected heads of the new tokens; K divides N (grouped
            query attention: each key/value head serves N / K query heads,
            the state is kept per query head).
        state: `initial_state(...)` or a state this returned.
        options: `SVROptions` (`head_factors`, `num_prefix_tokens`, BN,
            `chunk_size`).
        beta: b, a float or scalar tensor, or None for `options.beta`.
        valid: `(B, T)` boolean key padding of the new tokens, or None.
        limit: int scalar tensor, or None. Only the tokens at positions
            < `limit` enter the state (a prefill over a padded buffer,
            after which decoding resumes at `limit`); every token still
            gets its output.

    Returns:
        `(output (B, T, N, Dv) in value.dtype, new state)`. The outputs
        equal the full causal forward's at the same positions.
    """
    num_heads = query.shape[2]
    repeats = num_heads // key.shape[2]
    if repeats > 1:
        key, value = (ops.repeat(x, repeats, axis=2) for x in (key, value))
    start = state["position"][:1]  # every row stands at the same position
    taken, valid = limited(valid, start, shape_of(query)[1], limit)
    groups = {}
    for head, factor in enumerate(options.head_factors):
        groups.setdefault(factor, []).append(head)
    outputs, states, order = [], [], []
    for factor, heads in groups.items():
        pick = {
            name: visibility.select_heads(tensor, heads, num_heads, 1)
            for name, tensor in state.items()
            if name != "position"
        }
        q, k, v = (
            visibility.select_heads(x, heads, num_heads, 2)
            for x in (query, key, value)
        )
        out, new = _group_step(
            q, k, v, valid,
            state=pick, factor=factor, options=options, beta=beta,
            span=(start, taken),
        )  # fmt: skip
        outputs.append(out)
        states.append(new)
        order += heads
    inverse = [order.index(h) for h in range(num_heads)]

    def merge(parts, axis):
        x = parts[0] if len(parts) == 1 else ops.concatenate(parts, axis)
        return visibility.select_heads(x, inverse, num_heads, axis)

    new_state = {
        name: merge([s[name] for s in states], 1) for name in states[0]
    }
    new_state["position"] = state["position"] + taken
    output = ops.cast(merge(outputs, 2), value.dtype)
    return output, new_state


def limited(valid, start, length, limit):
    """`(taken, valid)`: how many of `length` new tokens from position
    `start` (`(1,)` int32) enter a state when only positions < `limit`
    may (an int scalar tensor, or None: all of them), and `valid` with the
    later ones made invalid."""
    if limit is None:
        return length, valid
    taken = ops.clip(ops.cast(limit, "int32") - start[0], 0, length)
    kept = positions(length)[None] < taken
    return taken, kept if valid is None else ops.logical_and(valid, kept)


def _group_step(query, key, value, valid, state, factor, options, beta, span):
    """One group of heads sharing `factor`: lay, recenter, recur. `span`
    is `(position of the first new token, how many enter the state)`."""
    laid, window = lay_new_tokens(
        key, value, valid,
        state=state, factor=factor,
        num_prefix_tokens=options.num_prefix_tokens, span=span,
    )  # fmt: skip
    laid_k, weights = laid["keys"], laid["weights"]
    new = {name: state[name] for name in state if name.startswith("window")}
    new.update(window)
    if options.uses_bn:
        beta = (options.beta or 0.0) if beta is None else beta
        mean, variance, sums = prefix_moments(
            laid_k, weights,
            state=state, factor=factor, options=options, start=span[0],
        )  # fmt: skip
        new.update(sums)
        query, laid_k = (
            statistics.normalize(x, mean, variance, beta, options.epsilon)
            for x in (query, laid_k)
        )
    phi_q = kernels.elu_feature_map(as_dtype(query, "float32"))
    phi_k = kernels.elu_feature_map(as_dtype(laid_k, "float32"))
    phi_k = phi_k * ops.expand_dims(weights, (2, 3))
    num, den, (kv, z) = kernels.causal_linear_attention(
        phi_q, phi_k, laid["values"], (state["kv"], state["z"]),
        options.chunk_size,
    )  # fmt: skip
    new.update(kv=kv, z=z)
    return kernels.divide_rows(num, den), new


def prefix_moments(laid_keys, weights, state, factor, options, start):
    """mu_t (and sigma_t^2) over the keys laid at positions <= t, from the
    state's running sums: `statistics.running_moments` with the state's
    `key_count`, `key_sum`, `key_square` and `shift`.

    The shift is the group's first pooled key, as in the full forward; no
    key has entered the sums before its position. Returns `(mean,
    variance or None, the sums after the last laid key)`.
    """
    names = ("key_count", "key_sum", "key_square")
    initial = {name: state[name] for name in names if name in state}
    first = 0 if options.num_prefix_tokens or factor == 1 else factor - 1
    here, last = first - start[0], shape_of(laid_keys)[1] - 1
    if isinstance(last, int) and last == 0:  # one new key, a step
        inside, first = here == 0, laid_keys[:, 0]
    else:
        inside = ops.logical_and(here >= 0, here <= last)
        here = ops.minimum(ops.maximum(here, 0), last)
        first = ops.take(laid_keys, here[None], axis=1)[:, 0]
    initial["shift"] = ops.where(inside, first, state["shift"])
    return statistics.running_moments(
        laid_keys, weights, options.standardize, initial
    )


# Long: one pass of window sums over counts, keys, values and first tokens.
def lay_new_tokens(key, value, valid, state, factor, num_prefix_tokens, span):
    """The group's keys and values of the new tokens, laid on positions.

    Unpooled: the tokens themselves, weighted by `valid`. Pooled by r: at
    the position where window w ends, the mean of its valid tokens (those
    of this call and the window's earlier tokens kept in `state`), weight
    1 when it holds one; 0 elsewhere. Prefix tokens (positions < p) stand
    alone. Window sums are differences of prefix sums over the new tokens.

    Args:
        span: `(start, taken)`: the position of the first new token
            (`(1,)` int32) and how many new tokens enter the state (an int
            or int scalar tensor); the later ones have weight 0 in `valid`.

    Returns:
        `(laid, window)`: `laid` holds `keys`, `values` and `weights`
        `(B|1, T)` float32, and, when `state` has `window_first`, `first`
        `(B, T)` float32, the position of the first valid token of the
        span that ends at each position; `window` the open window's sums
        after the last token taken (empty when unpooled).
    """
    start, taken = span
    key, value = as_dtype(key, "float32"), as_dtype(value, "float32")
    length = shape_of(key)[1]
    weights = ops.ones((1, length), "float32")
    if valid is not None:
        weights = ops.cast(valid, "float32")
    if factor == 1:
        return {"keys": key, "values": value, "weights": weights}, {}
    if isinstance(length, int) and length == 1 and isinstance(taken, int):
        return _lay_one(
            key, value, weights,
            state=state, factor=factor, num_prefix_tokens=num_prefix_tokens,
            start=start,
        )  # fmt: skip
    local = positions(length)
    rel = start + local - num_prefix_tokens  # (T,) position - p
    prefix = rel < 0
    into = ops.where(prefix, 0, rel % factor)  # place inside its window
    ends = ops.logical_and(ops.logical_not(prefix), into == factor - 1)
    begin = local - into  # the window's first token, < 0: an earlier call
    earlier = ops.cast(begin < 0, "float32")
    index = ops.maximum(begin, 0)

    def window_sum(x, name):
        total = zero_pad(ops.cumsum(x, axis=1), 1, before=1)
        window = total[:, 1:] - ops.take(total, index, axis=1)
        pending = state[name]  # (B, n, ...): the open window's sums
        if name in ("window_count", "window_first"):
            pending = pending[:, 0]  # every head of the group counts alike
        shape = (1, -1) + (1,) * (len(window.shape) - 2)
        return window + ops.reshape(earlier, shape) * pending[:, None]

    sums = {
        "window_count": window_sum(weights, "window_count"),
        "window_keys": window_sum(
            key * ops.expand_dims(weights, (2, 3)), "window_keys"
        ),
        "window_values": window_sum(
            value * ops.expand_dims(weights, (2, 3)), "window_values"
        ),
    }
    count = sums["window_count"]
    here = ops.cast(start + local, "float32")[None]
    if "window_first" in state:
        # A window's first valid token: valid, none counted before it.
        is_first = weights * ops.cast(count - weights == 0, "float32")
        sums["window_first"] = window_sum(is_first * here, "window_first")
    divisor = ops.expand_dims(ops.maximum(count, 1.0), (2, 3))
    flags = (1, -1, 1, 1)
    laid = {
        "keys": ops.where(
            ops.reshape(prefix, flags), key, sums["window_keys"] / divisor
        ),
        "values": ops.where(
            ops.reshape(prefix, flags), value, sums["window_values"] / divisor
        ),
    }
    if "window_first" in state:
        laid["first"] = ops.where(prefix[None], here, sums["window_first"])
    # A window enters at its end, if it holds a token and is taken.
    enters = ops.logical_and(ends, local < taken)[None]
    pooled = ops.cast(ops.logical_and(enters, count > 0), "float32")
    laid["weights"] = ops.where(prefix[None], weights, pooled)
    # The window left open after the last token taken (none if it just
    # ended); the state's own when no token is taken.
    last = ops.maximum(taken - 1, 0)
    closed = ops.logical_or(ends, prefix)
    still_open = ops.cast(
        ops.logical_not(ops.take(closed, last[None], axis=0)[0]), "float32"
    )
    heads = key.shape[2]
    window = {}
    for name, total in sums.items():
        at_last = ops.take(total, last[None], axis=1)[:, 0]
        if len(at_last.shape) == 1:  # (B,): one per head of the group
            at_last = ops.repeat(at_last[:, None], heads, axis=1)
        window[name] = ops.where(taken > 0, at_last * still_open, state[name])
    return laid, window


def _lay_one(key, value, weight, state, factor, num_prefix_tokens, start):
    """`lay_new_tokens` for one new token (a decoding step), in a few ops:
    the open window's sums plus the token, its mean laid if the window
    ends here (without prefix tokens, `p = 0`, no prefix test at all)."""
    p = num_prefix_tokens
    into = floor_mod(ops.maximum(start - p, 0) if p else start, factor)
    closed = into == factor - 1  # (1,)
    if p:
        prefix = start < p
        closed = ops.logical_or(prefix, closed)
    count = state["window_count"][:, :1] + weight  # (B, 1)
    weight_heads = ops.expand_dims(weight, (2, 3))
    sums = {
        "window_count": count,
        "window_keys": state["window_keys"][:, None] + key * weight_heads,
        "window_values": state["window_values"][:, None] + value * weight_heads,
    }
    if "window_first" in state:
        here = ops.cast(start, "float32")[None]  # (1, 1)
        is_first = weight * ops.cast(count - weight == 0, "float32")
        sums["window_first"] = state["window_first"][:, :1] + is_first * here
    divisor = ops.expand_dims(ops.maximum(count, 1.0), (2, 3))
    laid = {
        "keys": sums["window_keys"] / divisor,
        "values": sums["window_values"] / divisor,
        "weights": ops.cast(count > 0, "float32"),
    }
    if p:  # a prefix token stands alone
        flags = ops.reshape(prefix, (1, 1, 1, 1))
        laid["keys"] = ops.where(flags, key, laid["keys"])
        laid["values"] = ops.where(flags, value, laid["values"])
        laid["weights"] = ops.where(prefix[None], weight, laid["weights"])
    closes = ops.cast(closed, "float32")  # (1,)
    still_open = 1.0 - closes
    laid["weights"] = laid["weights"] * closes
    if "window_first" in state:
        laid["first"] = sums["window_first"]
        if p:
            laid["first"] = ops.where(prefix[None], here, laid["first"])
    heads = key.shape[2]
    window = {}
    for name, total in sums.items():
        total = total[:, 0]
        if len(total.shape) == 1:  # (B,): one per head of the group
            total = ops.repeat(total[:, None], heads, axis=1)
        window[name] = total * still_open  # none if it just closed
    return laid, window


def pack_state(state):
    """The state as one tensor `(B, 2, R, N, D)`, for cache plumbing that
    passes one tensor per layer (KerasHub's `call_with_cache` stacks and
    slices them), with `value_dim == key_dim`.

    Rows of `(B, N, D)`: S as its Dv rows, then one row per other entry
    (`(B, N)` and `(B,)` entries broadcast), in the order of
    `initial_state`; one zero row more when that count is odd.
    """
    batch, heads, dim = shape_of(state["kv"])[:3]
    rows = []
    for name in ORDER:
        if name not in state:
            continue
        tensor = ops.cast(state[name], "float32")
        if name == "kv":
            rows.append(ops.transpose(tensor, (0, 3, 1, 2)))
            continue
        while len(tensor.shape) < 3:
            tensor = ops.expand_dims(tensor, -1)
        rows.append(ops.broadcast_to(tensor[:, None], (batch, 1, heads, dim)))
    packed = ops.concatenate(rows, axis=1)
    count = packed.shape[1]
    packed = zero_pad(packed, 1, after=count % 2)
    return ops.reshape(packed, (batch, 2, (count + 1) // 2, heads, dim))


def unpack_state(packed, options, key_dim):
    """`pack_state`'s tensor -> the state dict of `options`."""
    template = initial_state(options, 1, key_dim, key_dim)
    batch, _, half, heads, dim = shape_of(packed)
    rows = ops.reshape(packed, (batch, 2 * half, heads, dim))
    state, start = {}, 0
    for name in ORDER:
        if name not in template:
            continue
        tensor = template[name]
        if name == "kv":
            kv = rows[:, start : start + dim]
            state[name] = ops.transpose(kv, (0, 2, 3, 1))
            start += dim
            continue
        row = rows[:, start]
        start += 1
        if len(tensor.shape) == 2:
            row = row[..., 0]
        elif len(tensor.shape) == 1:
            row = ops.cast(ops.round(row[:, 0, 0]), "int32")
        state[name] = row
    return state
