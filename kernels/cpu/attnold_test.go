package cpu

// rowsByHeads is rows before session 16, kept for the benchmarks that
// compare: it computes the given rows one (row, part of the KV heads) item at a
// time: scores off the cache with the matmul tiles, softmax, then P·V by
// pv over the value rows at the row's slots. An item walks the cache block
// by block, every KV head of its part within a block, so that it reads each
// slot's keys and values of those heads as one contiguous run: the
// hardware prefetchers follow that, where one head at a time would stride
// through the whole layer once per head. Parts split the heads so that a
// single row still keeps every worker busy.
func (a *attnCall) rowsByHeads(rows []int32) {
	maxLen := 0
	for _, i := range rows {
		maxLen = max(maxLen, int(a.pos[i])+1)
	}
	parts := min(a.kvh, max(1, a.b.Threads()/len(rows)))
	tiles := tilesFor(a.dt)
	esz := a.dt.Size()
	kw := a.kvh * a.hd
	hd, grp := a.hd, a.grp
	vdp := a.gemmScores() && hd%32 == 0 // scores on the gemm tiles, the queries rounded
	a.b.Parallel(len(rows)*parts, func(lo, hi int) {
		sc := make([]float32, (a.kvh+parts-1)/parts*grp*maxLen) // (heads of the part, len) scores, then probabilities
		offs := make([]int, maxLen)                             // element offsets of the row's positions in a cache layer
		var qb []uint16                                         // (heads of the part, hd) queries rounded, for vdp
		if vdp {
			qb = make([]uint16, (a.kvh+parts-1)/parts*grp*hd)
		}
		last := -1
		for item := lo; item < hi; item++ {
			i, part := int(rows[item/parts]), item%parts
			k0, k1 := part*a.kvh/parts, (part+1)*a.kvh/parts // KV heads [k0, k1)
			bt := a.table(a.seq[i])
			ln := int(a.pos[i]) + 1
			if i != last {
				a.offsets(offs[:ln], bt)
				last = i
			}
			// Scores, block by block: keys of a block are kw apart. The
			// part's heads stack as (kvh−k0)·grp + g.
			run := (k1 - k0) * hd // elements of a slot the item reads
			if vdp {
				q := a.q[(i*a.heads+k0*grp)*hd : (i*a.heads+k1*grp)*hd]
				roundBF16(qb[:len(q)], q)
			}
			for p0 := 0; p0 < ln; p0 += a.bs {
				nk := min(a.bs, ln-p0)
				if next := p0 + a.bs; next < ln { // the next block's keys, else the first values
					prefetchRows(a.dt, a.kraw[k0*hd*esz:], offs[next:min(next+a.bs, ln)], run)
				} else {
					prefetchRows(a.dt, a.vraw[k0*hd*esz:], offs[:min(a.bs, ln)], run)
				}
				for kvh := k0; kvh < k1; kvh++ {
					w := a.kraw[(offs[p0]+kvh*hd)*esz:]
					qg := a.q[(i*a.heads+kvh*grp)*hd : (i*a.heads+(kvh+1)*grp)*hd] // (group, hd)
					sg := sc[(kvh-k0)*grp*ln:]
					if vdp {
						a.scoresVDP(sg[p0:], ln, qb[(kvh-k0)*grp*hd:], w, nk)
						continue
					}
					g := 0
					for ; g+2 <= grp; g += 2 {
						x, y := qg[g*hd:], sg[g*ln+p0:]
						j := 0
						for ; j+4 <= nk; j += 4 {
							tiles.r2c4(y[j:], ln, x, hd, w[j*kw*esz:], kw, hd)
						}
						for ; j < nk; j++ {
							tiles.r2c1(y[j:], ln, x, hd, w[j*kw*esz:], kw, hd)
						}
					}
					for ; g < grp; g++ {
						x, y := qg[g*hd:], sg[g*ln+p0:]
						for j := range nk {
							tiles.r1c1(y[j:], 1, x, hd, w[j*kw*esz:], kw, hd)
						}
					}
				}
			}
			nh := (k1 - k0) * grp
			for r := range nh {
				softmaxRow(sc[r*ln:(r+1)*ln], a.scale)
			}
			o := a.out[(i*a.heads+k0*grp)*hd : (i*a.heads+k1*grp)*hd] // (heads of the part, hd)
			clear(o)
			for p0 := 0; p0 < ln; p0 += a.bs {
				blk := offs[p0:min(p0+a.bs, ln)]
				if next := p0 + a.bs; next < ln {
					prefetchRows(a.dt, a.vraw[k0*hd*esz:], offs[next:min(next+a.bs, ln)], run)
				}
				for kvh := k0; kvh < k1; kvh++ {
					v := a.vraw[kvh*hd*esz:]
					r0 := (kvh - k0) * grp
					g := 0
					for ; g+2 <= grp; g += 2 {
						pv(a.dt, o[(r0+g)*hd:], hd, sc[(r0+g)*ln+p0:], ln, v, blk, hd, 2)
					}
					if g < grp {
						pv(a.dt, o[(r0+g)*hd:], hd, sc[(r0+g)*ln+p0:], ln, v, blk, hd, 1)
					}
				}
			}
		}
	})
}
