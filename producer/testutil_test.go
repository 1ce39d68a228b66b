package producer

import (
	"io"
	"sync"
)

// lockedWriter serialises writes of concurrent loggers in tests.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
