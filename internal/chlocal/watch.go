package chlocal

import (
	"context"
	"time"
)

// Watch restarts the server, on the same folder and ports with its data,
// whenever its process exits without Stop or Kill (a crash, an OOM kill, a
// kill by pid), until ctx ends; it returns then. Failed restarts are retried
// with a growing pause (up to 10 s). A no-op for a server it did not start
// (Owned false). Run it in a goroutine owned by whoever owns the Server, and
// end its ctx before Stop.
func (s *Server) Watch(ctx context.Context) {
	if !s.Owned() {
		return
	}
	pause := 200 * time.Millisecond
	recheck := time.NewTicker(time.Second) // after a Stop, or a failed restart
	defer recheck.Stop()
	for {
		s.mu.Lock()
		exited, stopped := s.exited, s.stopped
		s.mu.Unlock()
		if exited == nil || stopped {
			select {
			case <-ctx.Done():
				return
			case <-recheck.C:
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-exited:
		}
		s.mu.Lock()
		stopped = s.stopped
		s.mu.Unlock()
		if stopped {
			continue
		}
		s.log.Warn("clickhouse: the local server exited; restarting it on the same ports", "dir", s.dir, "addr", s.Addr())
		for {
			err := s.Start(ctx)
			if err == nil {
				pause = 200 * time.Millisecond
				break
			}
			if ctx.Err() != nil {
				return
			}
			s.log.Error("clickhouse: restarting the local server failed; retrying", "dir", s.dir, "err", err, "in", pause)
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, 10*time.Second)
		}
	}
}
