package reporter

// Test-only views of the run's small types.

// committable returns the offset to commit (one past the final prefix) and
// its leader epoch; ok is false while no record has become final yet.
func (w *watermark) committable() (offset int64, epoch int32, ok bool) {
	return w.next, w.epoch, w.hasNext
}

// len is the number of report ids remembered.
func (s *recentSet) len() int { return len(s.ids) }
