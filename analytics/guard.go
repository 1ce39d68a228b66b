package analytics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Limits bound what one audit asks of the server (docs/audit.md, "The
// audit at scale"). Zero values take the defaults.
type Limits struct {
	// MaxMemory is each query's max_memory_usage in bytes (default 3 GiB);
	// GROUP BY and ORDER BY spill to disk past half of it
	// (max_bytes_before_external_group_by / _sort), so a query over a large
	// window slows down rather than fails, and never takes the server's
	// memory: past the limit the server ends the query, not itself.
	MaxMemory uint64
	// QueryTimeout is each query's deadline (default 5 minutes), also sent
	// as max_execution_time.
	QueryTimeout time.Duration
	// SliceReports: the audit splits the window's plays into ranges of
	// report ids of about this many plays, one group of queries each, so
	// that no query holds more than one range's reports. Default
	// 1 000 000 (with the join of the slices before: at 2.5 M a slice, 18.16
	// took 6–10 times as long per play).
	SliceReports uint64
	// Exact reads the raw ledger in one pass (the audit before slices): the
	// path every figure of the slices is checked against.
	Exact bool
	// MigrationWait is how long an audit that meets a ledger below the
	// schema version it reads waits for the migration under way (default
	// 30 s; < 0: not at all) before it says so.
	MigrationWait time.Duration
	// upTo: the distinct records per play and kind the slice query counts
	// with uniqUpTo before it reads a slice again with uniqExact (default
	// countsUpTo; the tests lower it to take the second way).
	upTo uint64
	// lookups, recordedTwice: the bounds maxLookups and maxRecordedTwice
	// of the delay's queries (delay.go; the tests lower them to take the
	// other ways; recordedTwice < 0: the slices join the events table).
	lookups, recordedTwice int
	// noNarrow: the slices count by perReportRows only, never by the
	// narrow form (audit_fast.go; the tests compare the two).
	noNarrow bool
	// Progress, when set, gets a line per query: the check, its window,
	// the time it took and the rows it read.
	Progress io.Writer
}

func (l Limits) withDefaults() Limits {
	if l.MaxMemory == 0 {
		l.MaxMemory = 3 << 30
	}
	if l.QueryTimeout <= 0 {
		l.QueryTimeout = 5 * time.Minute
	}
	if l.MigrationWait == 0 {
		l.MigrationWait = 30 * time.Second
	}
	if l.SliceReports == 0 {
		l.SliceReports = 1_000_000
	}
	return l
}

func (l Limits) countsUpTo() uint64 {
	if l.upTo == 0 {
		return countsUpTo
	}
	return l.upTo
}

func (l Limits) maxLookups() int {
	if l.lookups == 0 {
		return maxLookups
	}
	return l.lookups
}

func (l Limits) maxRecordedTwice() int {
	if l.recordedTwice == 0 {
		return maxRecordedTwice
	}
	return l.recordedTwice
}

// SetLimits sets the bounds of the auditor's queries; call it before the
// auditor is used.
func (a *Auditor) SetLimits(l Limits) { a.limits = l.withDefaults() }

type checkKey struct{}

// check is the name of what a query computes, for its progress line and
// its error: "plays", "partners, report ids 00–3f" …
type check struct {
	name   string
	window string
}

// withCheck names the check of the queries run with ctx.
func withCheck(ctx context.Context, o AuditOptions, name string) context.Context {
	return context.WithValue(ctx, checkKey{}, check{name: name,
		window: o.From.UTC().Format(time.RFC3339) + " → " + o.To.UTC().Format(time.RFC3339)})
}

func checkOf(ctx context.Context) check {
	c, _ := ctx.Value(checkKey{}).(check)
	if c.name == "" {
		c.name = "query"
	}
	return c
}

type shareKey struct{}

// share: the query runs beside others of the audit, n at once (the slices,
// auditSliced): it takes 1/n of the memory limit, and threads of the
// server's (its max_threads; 0: unknown, the server's default).
type share struct {
	n       int
	threads int
}

// withShare runs the queries of ctx as one of sh.n at once.
func withShare(ctx context.Context, sh share) context.Context {
	return context.WithValue(ctx, shareKey{}, sh)
}

// guarded runs f with the query's settings, deadline and progress count,
// writes its progress line, and words its error: the check and window, and
// what the failure means.
func (a *Auditor) guarded(ctx context.Context, f func(ctx context.Context) error) error {
	l := a.limits.withDefaults()
	c := checkOf(ctx)
	ctx, cancel := context.WithTimeout(ctx, l.QueryTimeout)
	defer cancel()
	var rows atomic.Uint64
	memory := l.MaxMemory
	settings := clickhouse.Settings{}
	if sh, ok := ctx.Value(shareKey{}).(share); ok && sh.n > 1 {
		memory /= uint64(sh.n)
		if sh.threads > 0 {
			settings["max_threads"] = max(1, sh.threads/sh.n)
		}
	}
	l.MaxMemory = memory // this query's limit, in its error too
	settings["max_memory_usage"] = int(memory)
	settings["max_bytes_before_external_group_by"] = int(memory / 2)
	settings["max_bytes_before_external_sort"] = int(memory / 2)
	settings["max_execution_time"] = int(l.QueryTimeout.Seconds())
	settings["max_query_size"] = maxQuerySize
	ctx = clickhouse.Context(ctx,
		clickhouse.WithSettings(settings),
		clickhouse.WithProgress(func(p *clickhouse.Progress) { rows.Add(p.Rows) }))
	start := time.Now()
	err := f(ctx)
	if l.Progress != nil {
		status := "ok"
		if err != nil {
			status = "failed"
		}
		a.progress.Lock()
		fmt.Fprintf(l.Progress, "playpipe audit: %s (%s): %s in %s, %d rows read\n", c.name, c.window, status, time.Since(start).Round(time.Millisecond), rows.Load())
		a.progress.Unlock()
	}
	if err != nil {
		return fmt.Errorf("analytics: audit check %q, window %s: %w", c.name, c.window, explain(err, l))
	}
	return nil
}

// explain words a query's failure.
func explain(err error, l Limits) error {
	var ex *clickhouse.Exception
	var ne net.Error
	switch {
	case errors.As(err, &ex) && ex.Code == 241:
		return fmt.Errorf("it needs more memory than its limit of %d MiB (raise --max-memory, or audit a shorter window): %w", l.MaxMemory>>20, err)
	case errors.As(err, &ex) && ex.Code == 159, errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("it did not finish within its deadline of %s (raise --query-timeout, or audit a shorter window): %w", l.QueryTimeout, err)
	case errors.As(err, &ex) && (ex.Code == 47 || ex.Code == 60):
		return fmt.Errorf("the ledger lacks a column or table this audit reads: is a migration under way? (playpipe migrate applies it): %w", err)
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("the ClickHouse server stopped answering (restarted, overloaded or out of memory?): %w", err)
	}
	return err
}

func (a *Auditor) row(ctx context.Context, q string, dest ...any) error {
	return a.guarded(ctx, func(ctx context.Context) error { return a.conn.QueryRow(ctx, q).Scan(dest...) })
}

// query runs q and calls scan for each row.
func (a *Auditor) query(ctx context.Context, q string, scan func(driver.Rows) error) error {
	return a.guarded(ctx, func(ctx context.Context) error {
		rows, err := a.conn.Query(ctx, q)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

func (a *Auditor) counts(ctx context.Context, q string) ([]Count, error) {
	out := []Count{}
	err := a.query(ctx, q, func(rows driver.Rows) error {
		var c Count
		if err := rows.Scan(&c.Key, &c.N); err != nil {
			return err
		}
		out = append(out, c)
		return nil
	})
	return out, err
}
