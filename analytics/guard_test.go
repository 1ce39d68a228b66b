package analytics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestExplain: a failed audit query says what happened in words, the
// check's limits named, the cause kept for errors.Is/As.
func TestExplain(t *testing.T) {
	l := Limits{}.withDefaults()
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: fakeTimeout{}}
	for _, c := range []struct {
		err  error
		want string
	}{
		{&clickhouse.Exception{Code: 241, Message: "Memory limit (for query) exceeded"}, "more memory than its limit of 3072 MiB"},
		{&clickhouse.Exception{Code: 159, Message: "Timeout exceeded"}, "deadline of 5m0s"},
		{fmt.Errorf("read: %w", context.DeadlineExceeded), "deadline of 5m0s"},
		{&clickhouse.Exception{Code: 47, Message: "Unknown identifier: kafka_topic_id"}, "is a migration under way"},
		{fmt.Errorf("query processing: failed to read packet: %w", timeout), "the ClickHouse server stopped answering"},
	} {
		got := explain(c.err, l)
		if !strings.Contains(got.Error(), c.want) || !errors.Is(got, c.err) {
			t.Errorf("explain(%v) = %v; want %q, wrapping the cause", c.err, got, c.want)
		}
	}
	other := errors.New("something else")
	if explain(other, l) != other {
		t.Error("an error of no known kind is returned as it is")
	}
	// The check and its window lead the message.
	a := &Auditor{limits: l}
	o := AuditOptions{From: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), To: time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)}
	var progress strings.Builder
	a.limits.Progress = &progress
	err := a.guarded(withCheck(context.Background(), o, "plays, slice 2/4"), func(context.Context) error { return timeout })
	if err == nil || !strings.Contains(err.Error(), `audit check "plays, slice 2/4", window 2026-01-01T00:00:00Z → 2026-01-02T00:00:00Z: the ClickHouse server stopped answering`) {
		t.Errorf("guarded: %v", err)
	}
	if !strings.Contains(progress.String(), "playpipe audit: plays, slice 2/4 (2026-01-01T00:00:00Z → 2026-01-02T00:00:00Z): failed in ") {
		t.Errorf("progress line %q", progress.String())
	}
}

type fakeTimeout struct{}

func (fakeTimeout) Error() string   { return "i/o timeout" }
func (fakeTimeout) Timeout() bool   { return true }
func (fakeTimeout) Temporary() bool { return true }

// TestShareSettings: a query run as one of n at once (the slices,
// sliceWorkers) takes 1/n of the memory limit and of the server's
// threads, and its error names its own limit; alone it takes the whole.
func TestShareSettings(t *testing.T) {
	ch := testenv.StartClickHouse(t)
	a, err := NewAuditor(ch.Conn(t), "default")
	if err != nil {
		t.Fatal(err)
	}
	a.SetLimits(Limits{MaxMemory: 1 << 30})
	ctx := context.Background()
	setting := func(ctx context.Context, name string) string {
		t.Helper()
		var v string
		if err := a.row(ctx, "SELECT value FROM system.settings WHERE name = '"+name+"'", &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	threads := a.serverThreads(ctx, AuditOptions{})
	if threads < 1 {
		t.Fatalf("server threads %d", threads)
	}
	shared := withShare(ctx, share{n: 2, threads: 4})
	for _, c := range []struct {
		ctx             context.Context
		memory, threads string
	}{
		{ctx, "1073741824", strconv.Itoa(threads)},
		{shared, "536870912", "2"},
		{withShare(ctx, share{n: 2, threads: 1}), "536870912", "1"},
	} {
		if m, th := setting(c.ctx, "max_memory_usage"), setting(c.ctx, "max_threads"); m != c.memory || !strings.Contains(th, c.threads) {
			t.Errorf("max_memory_usage %s, max_threads %s; want %s, %s", m, th, c.memory, c.threads)
		}
	}
	err = a.row(shared, "SELECT length(groupArray(number)) FROM numbers(100000000)", new(uint64))
	if err == nil || !strings.Contains(err.Error(), "limit of 512 MiB") {
		t.Errorf("a shared query over its limit: %v; want its limit of 512 MiB named", err)
	}
}
