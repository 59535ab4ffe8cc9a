"""The split-K GEMV's per-tile parts (radixmesh_kernels/gemv.py): a weight tile's load, the
activations a tile is multiplied with (as they are, silu_and_mul's of [gate | up], or a
residual stream's RMSNorm), the slices' fixed-order sum, and the output rows' store with the
residual add and the per-row statistics the next projection's norm reads."""

from __future__ import annotations

from radixmesh_kernels._triton import tl, triton


@triton.jit
def weight_tile(w_rows, offs_k, mask_n, in_features, EVEN: tl.constexpr):
    """One BLOCK_N x BLOCK_K weight tile, as stored (widened where it is used)."""
    if EVEN:
        return tl.load(w_rows + offs_k)
    return tl.load(w_rows + offs_k, mask=mask_n[:, None] & (offs_k < in_features), other=0.0)


@triton.jit
def load_columns(ptr, offs_k, in_features, EVEN: tl.constexpr):
    """The values at offs_k (zero past in_features unless EVEN), in fp32."""
    if EVEN:
        return tl.load(ptr + offs_k).to(tl.float32)
    return tl.load(ptr + offs_k, mask=offs_k < in_features, other=0.0).to(tl.float32)


@triton.jit
def activations(
    x_row, offs_k, k0, in_features, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
    GATED: tl.constexpr, NORM_INPUT: tl.constexpr, rstd_row, norm_w_ptr,
):  # fmt: skip
    """A row's activations at offs_k, in fp32. GATED: the row is [gate | up], 2 x in_features
    wide, and the activation silu(gate) * up, rounded as `silu_and_mul` rounds it (silu,
    then the product, to the row's dtype), so the fused and the two-op forms sum the same
    values. NORM_INPUT: the row is a residual stream and the activation its RMSNorm, from
    the row's 1/rms at rstd_row (`ADD_RESIDUAL`'s) and the norm's weight, rounded as
    `rmsnorm` rounds it.

    Plain activations are read through `offs_k`, the tile's [BLOCK_N, BLOCK_K] pointer tile
    (each thread the values of its own weights, from L1); a formed activation is formed
    once per column, on the BLOCK_K offsets from k0, and broadcast over the tile's rows (so
    the silu or the norm is not computed again for every weight row)."""
    if GATED or NORM_INPUT:
        offs_k = k0 + tl.arange(0, BLOCK_K)
    x = load_columns(x_row, offs_k, in_features, EVEN)
    dtype = x_row.dtype.element_ty
    if NORM_INPUT:
        norm_w = load_columns(norm_w_ptr, offs_k, in_features, EVEN)
        x = (norm_w * (x * tl.load(rstd_row)).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    if GATED:
        up = load_columns(x_row + in_features, offs_k, in_features, EVEN)
        x = ((x * tl.sigmoid(x)).to(dtype).to(tl.float32) * up).to(dtype).to(tl.float32)
    if GATED or NORM_INPUT:
        x = x[None, :]
    return x


@triton.jit
def add_tile(
    w, x_row0, x_row1, offs_k, k0, in_features, acc0, acc1,
    NUM_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
    VEC: tl.constexpr, GATED: tl.constexpr, NORM_INPUT: tl.constexpr, rstd_row0, rstd_row1,
    norm_w_ptr,
):  # fmt: skip
    """The tile's products with one or two activation rows, summed per lane into acc0/acc1."""
    w = w.to(tl.float32)
    x0 = activations(
        x_row0, offs_k, k0, in_features, BLOCK_K, EVEN, GATED, NORM_INPUT, rstd_row0, norm_w_ptr
    )
    acc0 += tl.sum(tl.reshape(w * x0, (BLOCK_N, BLOCK_K // VEC, VEC)), axis=2)
    if NUM_ROWS == 2:
        x1 = activations(
            x_row1, offs_k, k0, in_features, BLOCK_K, EVEN, GATED, NORM_INPUT, rstd_row1,
            norm_w_ptr,
        )
        acc1 += tl.sum(tl.reshape(w * x1, (BLOCK_N, BLOCK_K // VEC, VEC)), axis=2)
    return acc0, acc1


@triton.jit
def add_slices(
    out0, out1, partial_ptr, counter_ptr, bias_ptr, out_row0, stride_out, offs_n, mask_n, mask_1,
    out_features, pid_m, pid_n, pid_k, row0,
    NUM_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr, BLOCK_TILES: tl.constexpr, stats,
):  # fmt: skip
    """Writes this program's K-slice sums; the last program of the (tile, row pair) to take
    a ticket adds every slice in order, writes the rows and resets the ticket counter."""
    # partials: [SPLIT_K, padded rows, out_features]; a ticket per (weight tile, pair)
    padded_rows = tl.num_programs(0) * NUM_ROWS
    first = partial_ptr + row0.to(tl.int64) * out_features + offs_n
    part = first + (pid_k * padded_rows).to(tl.int64) * out_features
    tl.store(part, out0, mask=mask_n)
    if NUM_ROWS == 2:
        tl.store(part + out_features, out1, mask=mask_n)
    counter = counter_ptr + pid_n * tl.num_programs(0) + pid_m
    # every thread's partial is written before the ticket is taken (release), and the
    # last program reads the others' partials after its ticket (acquire), from L2
    tl.debug_barrier()
    ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLIT_K - 1:
        total0 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        total1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            slice_s = first + (s * padded_rows).to(tl.int64) * out_features
            total0 += tl.load(slice_s, mask=mask_n, other=0.0, cache_modifier=".cg")
            if NUM_ROWS == 2:
                total1 += tl.load(
                    slice_s + out_features, mask=mask_n, other=0.0, cache_modifier=".cg"
                )
        store_rows(
            total0, total1, bias_ptr, out_row0, stride_out, offs_n, mask_n, mask_1, NUM_ROWS,
            HAS_BIAS, ADD_RESIDUAL, BLOCK_TILES, stats,
        )  # fmt: skip
        tl.atomic_xchg(counter, 0)


@triton.jit
def store_rows(
    out0, out1, bias_ptr, out_ptr, stride_out, offs_n, mask_n, mask_1,
    NUM_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, ADD_RESIDUAL: tl.constexpr,
    BLOCK_TILES: tl.constexpr, stats,
):  # fmt: skip
    """`stats` (ADD_RESIDUAL): (the residual's first row, the sums-of-squares workspace, the
    row tickets, rstd, row0, second, pid_m, pid_n, out_features, eps)."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        out0 += bias
        out1 += bias
    if ADD_RESIDUAL:
        # the product rounded, then the sum rounded: as the unfused linear and add round
        dtype = out_ptr.dtype.element_ty
        residual_row0 = stats[0]
        res0 = tl.load(residual_row0 + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        out0 = (out0.to(dtype).to(tl.float32) + res0).to(dtype).to(tl.float32)
        if NUM_ROWS == 2:
            res1 = tl.load(residual_row0 + stride_out + offs_n, mask=mask_1, other=0.0)
            out1 = (out1.to(dtype).to(tl.float32) + res1.to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(out_ptr + offs_n, out0.to(out_ptr.dtype.element_ty), mask=mask_n)
    if NUM_ROWS == 2:
        tl.store(out_ptr + stride_out + offs_n, out1.to(out_ptr.dtype.element_ty), mask=mask_1)
    if ADD_RESIDUAL:
        row_statistics(
            out0, out1, mask_n, stats[1], stats[2], stats[3], stats[4], stats[5], stats[6],
            stats[7], stats[8], stats[9], NUM_ROWS, BLOCK_TILES,
        )  # fmt: skip


@triton.jit
def row_statistics(
    out0, out1, mask_n, sumsq_ptr, row_counter_ptr, rstd_ptr, row0, second, pid_m, pid_n,
    out_features, eps, NUM_ROWS: tl.constexpr, BLOCK_TILES: tl.constexpr,
):  # fmt: skip
    """Each output tile's sum of squares of its rows, to a [rows, tiles] workspace; the last
    tile to take its row pair's ticket adds them in tile order (the same 1/rms whatever the
    arrival order), writes 1/rms per row to rstd_ptr and resets the ticket."""
    num_tiles = tl.num_programs(1)
    slot = sumsq_ptr + row0 * num_tiles + pid_n
    tl.store(slot, tl.sum(tl.where(mask_n, out0 * out0, 0.0), axis=0))
    if NUM_ROWS == 2:
        tl.store(slot + num_tiles, tl.sum(tl.where(mask_n, out1 * out1, 0.0), axis=0))
    tl.debug_barrier()
    ticket = tl.atomic_add(row_counter_ptr + pid_m, 1, sem="acq_rel", scope="gpu")
    if ticket == num_tiles - 1:
        offs_t = tl.arange(0, BLOCK_TILES)
        mask_t = offs_t < num_tiles
        first = sumsq_ptr + row0 * num_tiles + offs_t
        total0 = tl.sum(tl.load(first, mask=mask_t, other=0.0, cache_modifier=".cg"), axis=0)
        tl.store(rstd_ptr + row0, tl.rsqrt(total0 / out_features + eps))
        if NUM_ROWS == 2:
            row1 = first + num_tiles
            total1 = tl.sum(tl.load(row1, mask=mask_t, other=0.0, cache_modifier=".cg"), axis=0)
            tl.store(rstd_ptr + row0 + 1, tl.rsqrt(total1 / out_features + eps), mask=second > 0)
        tl.atomic_xchg(row_counter_ptr + pid_m, 0)
