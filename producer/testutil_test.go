package producer

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/testenv"
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

// readTopic reads topic from the start (read_committed) until it holds at
// least want records or 20 s pass, then keeps reading for a quiet period so
// that records beyond want are seen too (exact-count checks can fail).
func readTopic(t testing.TB, k *testenv.Kafka, topic string, want int) []*kgo.Record {
	t.Helper()
	cl := k.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	var out []*kgo.Record
	poll := func(d time.Duration) int {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		n := 0
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r); n++ })
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < want && time.Now().Before(deadline) {
		poll(time.Second)
	}
	for poll(400*time.Millisecond) > 0 {
	}
	return out
}
