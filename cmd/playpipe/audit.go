package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/analytics"
)

func init() {
	register(command{
		name:    "audit",
		summary: "audit the ledger for a time window: received, rejected, derived, delivered, pending, doubles",
		run:     runAudit,
	})
}

const auditSynopsis = `Answers finance's question for a window of record times: events received, rejected by
reason, track plays derived (and below the minimum), delivered, rejected by the API by
message, answered by standby and later delivered, still pending, delivered more than once,
and the end-to-end delay (event → delivered). Every number names the --list that shows
the report ids (with the trace ids of their deliveries) behind it.

Exit status: 0 clean; 3 when a play is pending longer than --pending-threshold, was
delivered more than once, or was delivered although below the minimum (for cron/CI);
1 on errors; 2 on bad flags. Full guide: docs/audit.md.

Examples:
  playpipe audit --clickhouse-addr clickhouse:9000 --from 2026-11-01 --to 2026-12-01
  playpipe audit --from -1h --format json
  playpipe audit --from -24h --list pending --format csv
  playpipe audit --from 2026-11-01 --to 2026-12-01 --html november.html

Times: RFC 3339 (2026-11-21T10:00:00Z), a date (2026-11-21, UTC), epoch milliseconds,
"now", or a duration relative to now (-90m). --clickhouse-addr or --clickhouse-data DIR
is required; with --clickhouse-data the clickhouse-server running in DIR is used (started
if none runs there).`

// auditExit is an audit that found problems: exit status 3.
type auditExit struct{ problems []string }

func (e auditExit) Error() string {
	return "audit failed: " + strings.Join(e.problems, "; ")
}
func (auditExit) ExitCode() int { return exitAuditProblems }

const exitAuditProblems = 3

// auditFlags are the flags of playpipe audit.
type auditFlags struct {
	lf               logFlags
	cfg              analytics.Config
	from, to, format string
	list, htmlFile   string
	limit            int
	threshold        time.Duration
	sandboxes        []string
	exact, quiet     bool
	maxMemoryMiB     uint64
	queryTimeout     time.Duration
}

// limits are the bounds of the audit's queries from the flags; its
// progress lines go to stderr unless --quiet.
func (f *auditFlags) limits(stderr io.Writer) analytics.Limits {
	l := analytics.Limits{Exact: f.exact, MaxMemory: f.maxMemoryMiB << 20, QueryTimeout: f.queryTimeout}
	if !f.quiet {
		l.Progress = stderr
	}
	return l
}

func (f *auditFlags) register(fs *flag.FlagSet) {
	registerClickHouseFlags(fs, &f.cfg)
	f.lf.register(fs.StringVar)
	fs.StringVar(&f.from, "from", "-24h", "start of the window (inclusive)")
	fs.StringVar(&f.to, "to", "now", "end of the window (exclusive)")
	fs.StringVar(&f.format, "format", analytics.FormatTable, "output: table, csv or json")
	fs.StringVar(&f.list, "list", "", "print the records behind one number instead of the audit: "+strings.Join(analytics.ListNames(), ", ")+", "+analytics.ReplayListPrefix+"<replay id> (the plays a replay re-sent)")
	fs.IntVar(&f.limit, "limit", 1000, "most rows of a --list, and of each id list of the --html page (0: all)")
	fs.StringVar(&f.htmlFile, "html", "", "also write the audit as one self-contained HTML page (inline SVG charts, the ids behind every number) to this file; same exit status")
	fs.Func("sandbox-target", "a partner base URL that is a sandbox (repeatable), e.g. http://sandbox:8088: its deliveries are not counted as real; loopback URLs always are sandboxes", func(s string) error {
		f.sandboxes = append(f.sandboxes, s)
		return nil
	})
	fs.BoolVar(&f.exact, "exact", false, "read the raw ledger in one pass instead of in slices of report ids: the same figures, for a check; needs memory that grows with the window")
	fs.Uint64Var(&f.maxMemoryMiB, "max-memory", 3072, "memory limit of each audit query on the server, MiB (max_memory_usage; GROUP BY and sort spill to disk past half of it)")
	fs.DurationVar(&f.queryTimeout, "query-timeout", 5*time.Minute, "deadline of each audit query")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress line per query on stderr")
	fs.DurationVar(&f.threshold, "pending-threshold", 10*time.Minute, "a play pending longer than this (since its record time) fails the audit")
}

// options checks the flags and returns the audit's window and settings at
// now; an error is a usage error.
func (f *auditFlags) options(now time.Time) (analytics.AuditOptions, error) {
	opts := analytics.AuditOptions{PendingThreshold: f.threshold, Now: now, SandboxTargets: f.sandboxes}
	if f.threshold <= 0 {
		return opts, fmt.Errorf("--pending-threshold must be > 0, got %s", f.threshold)
	}
	var err error
	if opts.From, err = parseAuditTime(f.from, now); err != nil {
		return opts, fmt.Errorf("--from: %w", err)
	}
	if opts.To, err = parseAuditTime(f.to, now); err != nil {
		return opts, fmt.Errorf("--to: %w", err)
	}
	if err := opts.Validate(); err != nil {
		return opts, err
	}
	if err := analytics.CheckFormat(f.format); err != nil {
		return opts, err
	}
	if f.htmlFile != "" && f.list != "" {
		return opts, errors.New("--html and --list: choose one (the page holds every list)")
	}
	if f.list != "" && !validList(f.list) {
		return opts, fmt.Errorf("--list %q: accepted: %s, %s<replay id>", f.list, strings.Join(analytics.ListNames(), ", "), analytics.ReplayListPrefix)
	}
	if f.limit < 0 {
		return opts, fmt.Errorf("--limit must be ≥ 0, got %d", f.limit)
	}
	return opts, nil
}

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("audit", stderr, auditSynopsis)
	var f auditFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	usage := func(err error) error {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	log, err := f.lf.logger(stderr)
	if err != nil {
		return usage(err)
	}
	opts, err := f.options(time.Now())
	if err != nil {
		return usage(err)
	}
	cfg, conn, closeLedger, err := openLedger(ctx, f.cfg, log)
	if err != nil {
		return err
	}
	defer closeLedger()
	a, err := analytics.NewAuditor(conn, cfg.Database)
	if err != nil {
		return usage(err)
	}
	a.SetLimits(f.limits(stderr))
	if f.list != "" {
		rows, err := a.List(ctx, opts, f.list, f.limit)
		if err != nil {
			return err
		}
		return analytics.WriteList(stdout, rows, f.format)
	}
	return writeAudit(ctx, a, opts, &f, stdout, stderr)
}

// writeAudit writes the audit to stdout (and the --html page); the error
// of a clean write is an auditExit when the audit found problems.
func writeAudit(ctx context.Context, a *analytics.Auditor, opts analytics.AuditOptions, f *auditFlags, stdout, stderr io.Writer) error {
	r, err := a.Audit(ctx, opts)
	if err != nil {
		return err
	}
	if err := analytics.WriteAudit(stdout, r, f.format); err != nil {
		return err
	}
	if f.htmlFile != "" {
		if err := writeAuditHTML(ctx, a, opts, r, f.limit, f.htmlFile); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "playpipe audit: wrote %s\n", f.htmlFile)
	}
	if ps := r.Problems(); len(ps) > 0 {
		return auditExit{ps}
	}
	return nil
}

func validList(name string) bool {
	if id, ok := strings.CutPrefix(name, analytics.ReplayListPrefix); ok {
		return id != ""
	}
	for _, n := range analytics.ListNames() {
		if n == name {
			return true
		}
	}
	return false
}

// parseAuditTime accepts RFC 3339, a date or date-time without zone (UTC),
// epoch milliseconds, "now", or a signed duration relative to now.
func parseAuditTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "now" {
		return now, nil
	}
	if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		if d, err := time.ParseDuration(s); err == nil {
			return now.Add(d), nil
		}
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil && len(s) >= 10 {
		return time.UnixMilli(ms), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("accepted: RFC 3339 (2026-11-21T10:00:00Z), 2026-11-21[T10:00[:00]] (UTC), epoch milliseconds, now, or -90m (relative to now); got " + strconv.Quote(s))
}

// writeAuditHTML writes the page of r to path (through a temporary file in
// the same folder, renamed when complete).
func writeAuditHTML(ctx context.Context, a *analytics.Auditor, opts analytics.AuditOptions, r *analytics.Audit, limit int, path string) error {
	h, err := a.HTML(ctx, opts, r, limit)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".audit-*.html")
	if err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	defer os.Remove(f.Name()) // after a successful rename: nothing left to remove
	if err := analytics.WriteHTML(f, h); err != nil {
		f.Close()
		return fmt.Errorf("--html: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	return nil
}
