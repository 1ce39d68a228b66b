package analytics

import (
	"context"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestInsertsNotInDoubt: of many small inserts in a row, each on a pooled
// connection, none fails. With the insert's context cancelled the moment
// Send returned, clickhouse-go's Send watchdog now and then closed the
// connection after it went back to the pool, and the next insert on it
// failed after the server took its rows (in doubt: retried, the rows
// twice; 1–3 of 500 inserts in each of three runs under -race before the
// fix in insertTable).
func TestInsertsNotInDoubt(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	ctx := context.Background()
	topics := kafkax.TopicsFor("plays")
	bt := newBatch(topics)
	for _, r := range benchRecords(t, topics, 30) {
		bt.add(r)
	}
	s, err := NewSink(SinkConfig{Kafka: testKafkaConfig(), ClickHouse: Config{Addr: ch.Addr, Database: ch.Database, User: ch.User, Password: ch.Password},
		Logger: testLogger(), RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := s.cfg.ClickHouse.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := Migrate(ctx, conn, ch.Database); err != nil {
		t.Fatal(err)
	}
	const inserts = 500
	for range inserts {
		if err := s.insert(ctx, conn, bt); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.stats.retries.Load(); n != 0 {
		t.Errorf("%d of %d inserts failed and were retried, want 0", n, inserts)
	}
}
