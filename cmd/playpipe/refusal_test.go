package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// clearTargetEnv empties the environment variables that name a Kafka, a
// partner API or a ClickHouse, so that only the flags of a test count.
func clearTargetEnv(t *testing.T) {
	for _, k := range []string{"PLAYPIPE_BROKERS", "PLAYPIPE_API_URL", "PLAYPIPE_CLICKHOUSE_ADDR", "PLAYPIPE_CLICKHOUSE_DATA", "PLAYPIPE_ADMIN_ADDR"} {
		t.Setenv(k, "")
	}
}

// TestRolesRefuseWithoutTargets: a role with no Kafka, partner API or
// ClickHouse configured, and without the explicit local alternative, exits 2
// at once with a message naming the missing flag, its environment variable
// and the alternative; so does a role given both a target and its
// alternative.
func TestRolesRefuseWithoutTargets(t *testing.T) {
	clearTargetEnv(t)
	sum := sha256.Sum256([]byte("refusal-test-key"))
	key := "acme:" + hex.EncodeToString(sum[:])
	admin := []string{"--admin-addr", "off"}
	noKafka := []string{"no Kafka brokers configured", "--brokers", "PLAYPIPE_BROKERS", "--embedded-kafka"}
	noAPI := []string{"no partner API configured", "--api-url", "PLAYPIPE_API_URL", "--sandbox"}
	noCH := []string{"no ClickHouse configured", "--clickhouse-addr", "PLAYPIPE_CLICKHOUSE_ADDR", "--clickhouse-data"}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"report/no brokers", append([]string{"report", "--api-url", "http://127.0.0.1:1"}, admin...), noKafka},
		{"report/no api", append([]string{"report", "--brokers", "127.0.0.1:1"}, admin...), noAPI},
		{"report/nothing", append([]string{"report"}, admin...), noKafka},
		{"report/api and sandbox", append([]string{"report", "--brokers", "127.0.0.1:1", "--api-url", "http://127.0.0.1:1", "--sandbox"}, admin...),
			[]string{"--api-url", "--sandbox", "exclude each other"}},
		{"report/brokers and embedded", append([]string{"report", "--brokers", "127.0.0.1:1", "--embedded-kafka", "--sandbox"}, admin...),
			[]string{"--brokers", "--embedded-kafka", "exclude each other"}},
		{"report/embedded port alone", append([]string{"report", "--embedded-kafka-port", "19999", "--sandbox"}, admin...),
			[]string{"--embedded-kafka-port needs --embedded-kafka"}},
		{"consume/no brokers", append([]string{"consume", "--api-url", "http://127.0.0.1:1"}, admin...), noKafka},
		{"consume/no api", append([]string{"consume", "--brokers", "127.0.0.1:1"}, admin...), noAPI},
		{"sink/no brokers", append([]string{"sink", "--clickhouse-addr", "127.0.0.1:1"}, admin...), noKafka},
		{"sink/no clickhouse", append([]string{"sink", "--brokers", "127.0.0.1:1"}, admin...), noCH},
		{"sink/addr and data", append([]string{"sink", "--brokers", "127.0.0.1:1", "--clickhouse-addr", "127.0.0.1:1", "--clickhouse-data", t.TempDir()}, admin...),
			[]string{"--clickhouse-addr", "--clickhouse-data", "exclude each other"}},
		{"ingest/no brokers", append([]string{"ingest", "--api-key", key, "--addr", "127.0.0.1:0"}, admin...), noKafka},
		{"migrate/no clickhouse", []string{"migrate"}, noCH},
		{"audit/no clickhouse", []string{"audit"}, noCH},
		{"simulate/no catalog", []string{"simulate", "--brokers", "127.0.0.1:1", "--events", "1"}, []string{"no catalog", "--mixes", "--api-url", "--sandbox"}},
		{"simulate/embedded", []string{"simulate", "--embedded-kafka", "--events", "1", "--sandbox"}, []string{"--brokers is required"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var out, errb bytes.Buffer
			begin := time.Now()
			code := runMain(ctx, c.args, &out, &errb)
			if code != 2 {
				t.Fatalf("%v: exit %d, want 2; stderr:\n%s", c.args, code, errb.String())
			}
			msg := errb.String()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%v: stderr does not say %q:\n%s", c.args, w, msg)
				}
			}
			if !strings.HasPrefix(msg, "playpipe "+c.args[0]+": ") {
				t.Errorf("the message does not name the command: %q", msg)
			}
			if strings.Contains(msg, "usage error") {
				t.Errorf("the message carries the internal sentinel: %q", msg)
			}
			// A refusal happens before any connection attempt (every
			// configured address here is a closed port or a bad folder).
			if d := time.Since(begin); d > 5*time.Second {
				t.Errorf("the refusal took %s: something was started or dialled first", d)
			}
		})
	}
}

// TestReportRunsWithExplicitLocalParts: with --embedded-kafka and --sandbox
// the reporter starts (its /readyz answers ready: the embedded broker
// answers) and stops cleanly when its context ends.
func TestReportRunsWithExplicitLocalParts(t *testing.T) {
	clearTargetEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	admin := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- runMain(ctx, []string{"report", "--embedded-kafka", "--sandbox", "--partitions", "1", "--admin-addr", admin, "--log-level", "warn"}, &bytes.Buffer{}, &errb)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://%s/readyz", admin))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case code := <-done:
			t.Fatalf("report exited %d before it was ready; stderr:\n%s", code, errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("report not ready after 30 s (last: %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("report exited %d after cancel; stderr:\n%s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		var stacks bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 2)
		t.Fatalf("report did not stop within 30 s of its context ending; goroutines:\n%s", stacks.String())
	}
	for _, w := range []string{"--embedded-kafka", "NOT durable", "--sandbox"} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("the warnings do not say %q:\n%s", w, errb.String())
		}
	}
}
