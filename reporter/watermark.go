package reporter

// watermark tracks, for one partition, which fetched records have a final
// outcome, and yields the offset that is safe to commit: one past the last
// record of the longest prefix (in fetch order) whose records are all final.
//
// Records are added in the order they were fetched (strictly increasing
// offsets, possibly with gaps: transaction markers, compaction). Each add
// returns a sequence number; markDone(seq) marks that record final. Entries
// leave the tracker as soon as the contiguous prefix passes them, so the
// tracker holds exactly the records between the commit point and the newest
// fetched one. It is not safe for concurrent use: its partition's lock
// (partState.mu) guards it.
type watermark struct {
	entries []wmEntry // entries[head:] are pending, entries[head] has sequence base
	head    int
	base    uint64 // sequence number of entries[head]

	// next is the committable offset (last final prefix record + 1) and
	// epoch its leader epoch; valid once hasNext is true.
	next    int64
	epoch   int32
	hasNext bool
}

type wmEntry struct {
	offset int64
	at     int64 // when it was fetched (Unix nanoseconds)
	epoch  int32
	done   bool
}

// add appends a record fetched at (Unix nanoseconds) and returns its
// sequence number.
func (w *watermark) add(offset int64, epoch int32, at int64) uint64 {
	if w.head > 0 && w.head >= len(w.entries)/2 {
		// Compact: the consumed prefix is at least half of the slice.
		n := copy(w.entries, w.entries[w.head:])
		clear(w.entries[n:])
		w.entries = w.entries[:n]
		w.head = 0
	}
	w.entries = append(w.entries, wmEntry{offset: offset, epoch: epoch, at: at})
	return w.base + uint64(len(w.entries)-w.head-1)
}

// markDone marks the record of seq final and returns how many records left
// the tracker (the commit point moved past them). Marking an unknown or
// already-passed sequence is a no-op.
func (w *watermark) markDone(seq uint64) int {
	if seq < w.base {
		return 0
	}
	i := w.head + int(seq-w.base)
	if i >= len(w.entries) {
		return 0
	}
	w.entries[i].done = true
	popped := 0
	for w.head < len(w.entries) && w.entries[w.head].done {
		e := w.entries[w.head]
		w.next, w.epoch, w.hasNext = e.offset+1, e.epoch, true
		w.head++
		w.base++
		popped++
	}
	if w.head == len(w.entries) {
		w.entries = w.entries[:0]
		w.head = 0
	}
	return popped
}

// oldest is when the oldest pending record was fetched (Unix nanoseconds);
// ok is false when none is pending.
func (w *watermark) oldest() (at int64, ok bool) {
	if w.head < len(w.entries) {
		return w.entries[w.head].at, true
	}
	return 0, false
}

// holds reports whether seq is the first pending record: the one the
// commit point waits for.
func (w *watermark) holds(seq uint64) bool { return seq == w.base && w.head < len(w.entries) }

// pending is the number of records not yet passed by the commit point
// (not final, or final behind a record that is not).
func (w *watermark) pending() int { return len(w.entries) - w.head }

// commitPoint returns the offset to commit with the tracker's progress: one
// past the final prefix, or the first pending record when nothing became
// final yet; ok is false while the tracker has seen nothing.
func (w *watermark) commitPoint() (offset int64, epoch int32, ok bool) {
	if w.hasNext {
		return w.next, w.epoch, true
	}
	if w.head < len(w.entries) {
		e := w.entries[w.head]
		return e.offset, e.epoch, true
	}
	return 0, 0, false
}

// appendDone appends the offsets of the final records past the commit point.
func (w *watermark) appendDone(dst []int64) []int64 {
	for _, e := range w.entries[w.head:] {
		if e.done {
			dst = append(dst, e.offset)
		}
	}
	return dst
}
