"""The Triton kernel of `mvc.quant.triton_assign` (imported only where Triton is used: this
module needs the `triton` package, which mvc never requires)."""
import triton
import triton.language as tl


@triton.jit
def assign_chunk(xs_ptr, raw_ptr, drop_ptr, w_ptr, sens_ptr, blocks_ptr, n_blocks,
              mids_ptr, kvec_ptr, prune_ptr, protect_ptr, protect_sens_ptr, by_sens_ptr,
              table_ptr, width, lev_ptr, sums_ptr, hist_ptr,
              MP: tl.constexpr, LOG2_MP: tl.constexpr, HP: tl.constexpr,
              LOG_DOMAIN: tl.constexpr, HAS_DROP: tl.constexpr, HAS_SENS: tl.constexpr,
              WEIGHTED: tl.constexpr, NS: tl.constexpr, BLOCK_: tl.constexpr):
    pid = tl.program_id(0)
    job = tl.load(blocks_ptr + pid)
    start = tl.load(blocks_ptr + n_blocks + pid)
    stop = tl.load(blocks_ptr + 2 * n_blocks + pid)
    offs = start + tl.arange(0, BLOCK_)
    inb = offs < stop
    x = tl.load(xs_ptr + offs, mask=inb, other=0.0)
    # the number of midpoints below x: a branchless search of the job's row, padded with
    # +inf to MP entries (MP > its midpoints)
    row = mids_ptr + job * MP
    lv = tl.zeros([BLOCK_], dtype=tl.int32)
    for i in tl.static_range(LOG2_MP):
        mv = tl.load(row + lv + ((MP >> (i + 1)) - 1))
        lv = tl.where(mv < x, lv + (MP >> (i + 1)), lv)
    k = tl.load(kvec_ptr + job)
    mag = tl.abs(x)
    # a rule that is off has an infinite threshold (prune -inf, protect +inf): it never fires
    protect = mag > tl.load(protect_ptr + job)
    imp = mag
    if HAS_SENS:  # |g w|: protected above its own threshold, pruned by it where the job says
        sv = tl.load(sens_ptr + offs, mask=inb, other=0.0)
        protect = protect | (sv > tl.load(protect_sens_ptr + job))
        imp = tl.where(tl.load(by_sens_ptr + job) != 0, sv, mag)
    prune = (imp <= tl.load(prune_ptr + job)) & (protect == 0)
    if HAS_DROP:
        dropped = tl.load(drop_ptr + offs, mask=inb, other=0) != 0
        prune = prune | dropped
        protect = protect & (dropped == 0)
    lv = tl.where(prune, k, lv)
    lv = tl.where(protect, k + 1, lv)
    tl.store(lev_ptr + offs, lv.to(lev_ptr.dtype.element_ty), mask=inb)
    # the block's level counts (lv < width < HP); lanes past the block's end count in the
    # spare last bin (`histogram`'s mask argument is newer than some torch builds' Triton)
    hist = tl.histogram(tl.where(inb, lv, HP - 1), HP)
    tl.store(hist_ptr + pid * HP + tl.arange(0, HP), hist)
    # the six error sums (`mvc.quant.error`), in float64, in the measured quantity
    r = tl.load(raw_ptr + offs, mask=inb, other=0.0)
    if LOG_DOMAIN:
        r = tl.sqrt_rn(tl.maximum(r, 0.0))
    x64 = r.to(tl.float64)
    tv = tl.load(table_ptr + job * width + lv, mask=inb, other=0.0).to(tl.float64)
    d = tl.where(inb & (protect == 0), tv - x64, 0.0)
    dd = d * d
    xx = x64 * x64
    ax = tl.abs(x64)
    out = sums_ptr + pid * NS
    tl.store(out, tl.sum(dd, axis=0))
    tl.store(out + 1, tl.sum(xx, axis=0))
    tl.store(out + 2, tl.sum(ax * dd, axis=0))
    tl.store(out + 3, tl.sum(ax * xx, axis=0))
    if WEIGHTED:
        aw = tl.abs(tl.load(w_ptr + offs, mask=inb, other=0.0).to(tl.float64))
        tl.store(out + 4, tl.sum(aw * dd, axis=0))
        tl.store(out + 5, tl.sum(aw * xx, axis=0))
