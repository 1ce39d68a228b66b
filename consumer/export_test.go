package consumer

// crash closes the session's client without ending the open transaction
// (tests: a process that dies mid-stream).
func (e *Enricher) crash() {
	e.mu.Lock()
	s := e.sess
	e.mu.Unlock()
	if s != nil {
		e.crashed.Store(true)
		s.Client().Close()
	}
}
