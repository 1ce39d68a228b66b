package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestMigrateAndSinkCommands runs `playpipe migrate` twice and `playpipe sink`
// against a real broker and ClickHouse server, then stops the sink as a
// SIGTERM would and checks the ledger.
func TestMigrateAndSinkCommands(t *testing.T) {
	k := testenv.SharedApacheKafka(t, 2)
	ch := testenv.StartClickHouse(t)
	ctx := context.Background()
	chFlags := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--log-level", "warn"}

	var versions []string
	for _, m := range analytics.Migrations {
		versions = append(versions, strconv.FormatUint(uint64(m.Version), 10))
	}
	for i, want := range []string{"applied [" + strings.Join(versions, " ") + "]", "nothing to apply"} {
		var out, errb bytes.Buffer
		if code := runMain(ctx, append([]string{"migrate"}, chFlags...), &out, &errb); code != 0 || !strings.Contains(out.String(), want) {
			t.Fatalf("migrate #%d: exit %d, stdout %q, stderr %q; want %q", i+1, code, out.String(), errb.String(), want)
		}
	}

	prod := k.Client(t)
	var recs []*kgo.Record
	for i := range 50 {
		recs = append(recs, &kgo.Record{Topic: k.Config.Topics().Events, Value: fmt.Appendf(nil, `{"event_id":"cli-%d"}`, i)})
	}
	recs = append(recs, &kgo.Record{Topic: k.Config.Topics().Deliveries, Value: []byte("garbage")})
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	sctx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	var out, errb bytes.Buffer
	go func() {
		args := append([]string{"sink", "--brokers", strings.Join(k.Config.Brokers, ","), "--topic-prefix", k.Config.TopicPrefix, "--partitions", "2", "--linger", "50ms", "--batch-rows", "20"}, chFlags...)
		done <- runMain(sctx, args, &out, &errb)
	}()
	conn := ch.Conn(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var events, malformed uint64
		err := conn.QueryRow(ctx, "SELECT (SELECT uniqExact(kafka_partition, kafka_offset) FROM "+ch.Database+".events), (SELECT count() FROM "+ch.Database+".malformed)").Scan(&events, &malformed)
		if err == nil && events == 50 && malformed == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger after 30 s: events %d, malformed %d (err %v); sink stderr:\n%s", events, malformed, err, errb.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("sink exited %d after cancel; stderr:\n%s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sink did not stop within 30 s of its context ending")
	}

	var errb2 bytes.Buffer
	if code := runMain(ctx, []string{"sink", "--brokers", "127.0.0.1:1", "--clickhouse-addr", "127.0.0.1:1", "--batch-rows", "-1"}, &bytes.Buffer{}, &errb2); code != 2 || !strings.Contains(errb2.String(), "--batch-rows") {
		t.Fatalf("sink --batch-rows 0: exit %d, stderr %q; want 2 naming the flag", code, errb2.String())
	}
}
