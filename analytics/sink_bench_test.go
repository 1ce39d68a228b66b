package analytics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// benchRecords returns n records in the pipeline's proportions: for every
// event one track play and one delivery.
func benchRecords(b testing.TB, topics kafkax.Topics, n int) []*kgo.Record {
	now := time.Now()
	out := make([]*kgo.Record, 0, n)
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprintf("bench-%09d", i)
		rid, p := playJSON(b, id, 0, false)
		tp := []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}
		out = append(out,
			&kgo.Record{Topic: topics.Events, Partition: int32(i % 6), Offset: int64(i), Key: []byte(id), Value: eventJSON(b, id, "user-1"), Timestamp: now, Headers: tp},
			&kgo.Record{Topic: topics.Reports, Partition: int32(i % 6), Offset: int64(i), Key: []byte(rid), Value: p, Timestamp: now, Headers: tp},
			&kgo.Record{Topic: topics.Deliveries, Partition: int32(i % 6), Offset: int64(i), Key: []byte(rid),
				Value: deliveryJSON(b, rid, id, schemas.OutcomeDelivered, 1, now.UnixMilli(), "4bf92f3577b34da6a3ce929d0e0e4736", "success"), Timestamp: now})
	}
	return out[:n]
}

// BenchmarkSinkBatch measures the sink's work per batch of 10k records
// against the real ClickHouse server: decoding the records into columns,
// inserting them (native protocol, one insert per table), and both. The
// sink runs decoding (reader) and inserting (writer) in two goroutines.
// cpu-ns/row is this process's CPU per row (the server's is not in it):
// steadier than ns/op, which includes waiting for the server.
//
//	go test ./analytics -run '^$' -bench SinkBatch -benchtime 20x
func BenchmarkSinkBatch(b *testing.B) {
	ch := testenv.StartClickHouse(b)
	conn := ch.Conn(b)
	topics := kafkax.TopicsFor("plays")
	const rows = 10000
	recs := benchRecords(b, topics, rows)
	s, err := NewSink(SinkConfig{Kafka: testKafkaConfig(), ClickHouse: Config{Addr: ch.Addr, Database: ch.Database}, Logger: testLogger()})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := Migrate(ctx, conn, ch.Database); err != nil {
		b.Fatal(err)
	}
	decode := func() *batch {
		bt := newBatch(topics)
		for _, r := range recs {
			bt.add(r)
		}
		return bt
	}
	b.Run("decode", func(b *testing.B) {
		cpu0 := processCPU(b)
		for range b.N {
			decode()
		}
		b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
		b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N*rows), "cpu-ns/row")
	})
	pre := decode()
	b.Run("insert", func(b *testing.B) {
		cpu0 := processCPU(b)
		for range b.N {
			if err := s.insert(ctx, conn, pre); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
		b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N*rows), "cpu-ns/row")
	})
	// The row-wise alternative of the public batch API (batch.Append of
	// one row's values, what AppendStruct does after reflection), measured
	// for the choice of insert API (docs/audit.md "Insert API").
	b.Run("insert-rows", func(b *testing.B) {
		cpu0 := processCPU(b)
		for range b.N {
			for _, t := range pre.tables() {
				if err := insertRows(ctx, conn, ch.Database, t); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
		b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N*rows), "cpu-ns/row")
	})
	b.Run("decode+insert", func(b *testing.B) {
		cpu0 := processCPU(b)
		for range b.N {
			if err := s.insert(ctx, conn, decode()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
		b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N*rows), "cpu-ns/row")
	})
}

// BenchmarkSinkEndToEnd measures the whole role: records produced to the
// embedded broker beforehand, then the sink (consumer group, read_committed,
// 10k-row batches, commit after insert) until all are in ClickHouse.
//
//	go test ./analytics -run '^$' -bench SinkEndToEnd -benchtime 3x
func BenchmarkSinkEndToEnd(b *testing.B) {
	const n = 150_000
	e := newEnv(b)
	conn := e.ch.Conn(b)
	ctx := context.Background()
	var total time.Duration // of the timed parts: rows/s is over all iterations
	var cpu time.Duration   // this process's CPU (sink and broker) in the timed parts
	for i := range b.N {
		b.StopTimer()
		// A fresh topic prefix and database per iteration.
		cfg := e.cfg
		cfg.Kafka.TopicPrefix = fmt.Sprintf("bench%d", i)
		cfg.ClickHouse.Database = fmt.Sprintf("%s_b%d", e.ch.Database, i)
		cfg.BatchRows, cfg.Linger = 10000, 200*time.Millisecond
		if err := kafkax.EnsureTopics(ctx, cfg.Kafka); err != nil {
			b.Fatal(err)
		}
		recs := benchRecords(b, cfg.Kafka.Topics(), n)
		for _, r := range recs {
			r.Partition, r.Offset = 0, 0
		}
		if err := e.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
		s, err := NewSink(cfg)
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		b.StartTimer()
		start, cpu0 := time.Now(), processCPU(b)
		go func() { done <- s.Run(rctx) }()
		db := cfg.ClickHouse.Database
		for {
			var got uint64
			err := conn.QueryRow(ctx, "SELECT (SELECT count() FROM "+db+".events) + (SELECT count() FROM "+db+".plays) + (SELECT count() FROM "+db+".deliveries)").Scan(&got)
			if err == nil && got >= n {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		total += time.Since(start)
		cpu += processCPU(b) - cpu0
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/total.Seconds(), "rows/s")
	// CPU per row is steadier than rows/s on a shared machine: other
	// processes' load stretches the wall time, not this process's work.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n*b.N), "cpu-ns/row")
}

// BenchmarkSinkDecode measures decoding alone as the sink's reader does it:
// records in the pipeline's proportions into a reused batch (no ClickHouse;
// per record, with allocations).
//
//	go test ./analytics -run '^$' -bench 'SinkDecode$' -benchmem -count 6
func BenchmarkSinkDecode(b *testing.B) {
	topics := kafkax.TopicsFor("plays")
	const rows = 10000
	recs := benchRecords(b, topics, rows)
	bt := newBatch(topics)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%rows == 0 {
			bt.reset()
		}
		bt.add(recs[i%rows])
	}
}
