package main

import (
	"context"
	"errors"
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

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("audit", stderr, auditSynopsis)
	var (
		lf               logFlags
		cfg              analytics.Config
		from, to, format string
		list, htmlFile   string
		limit            int
		threshold        time.Duration
		sandboxes        []string
	)
	registerClickHouseFlags(fs, &cfg)
	lf.register(fs.StringVar)
	fs.StringVar(&from, "from", "-24h", "start of the window (inclusive)")
	fs.StringVar(&to, "to", "now", "end of the window (exclusive)")
	fs.StringVar(&format, "format", analytics.FormatTable, "output: table, csv or json")
	fs.StringVar(&list, "list", "", "print the records behind one number instead of the audit: "+strings.Join(analytics.ListNames(), ", ")+", "+analytics.ReplayListPrefix+"<replay id> (the plays a replay re-sent)")
	fs.IntVar(&limit, "limit", 1000, "most rows of a --list, and of each id list of the --html page (0: all)")
	fs.StringVar(&htmlFile, "html", "", "also write the audit as one self-contained HTML page (inline SVG charts, the ids behind every number) to this file; same exit status")
	fs.Func("sandbox-target", "a partner base URL that is a sandbox (repeatable), e.g. http://sandbox:8088: its deliveries are not counted as real; loopback URLs always are sandboxes", func(s string) error {
		sandboxes = append(sandboxes, s)
		return nil
	})
	fs.DurationVar(&threshold, "pending-threshold", 10*time.Minute, "a play pending longer than this (since its record time) fails the audit")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	usage := func(err error) error {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return usage(err)
	}
	now := time.Now()
	opts := analytics.AuditOptions{PendingThreshold: threshold, Now: now, SandboxTargets: sandboxes}
	if threshold <= 0 {
		return usage(fmt.Errorf("--pending-threshold must be > 0, got %s", threshold))
	}
	if opts.From, err = parseAuditTime(from, now); err != nil {
		return usage(fmt.Errorf("--from: %w", err))
	}
	if opts.To, err = parseAuditTime(to, now); err != nil {
		return usage(fmt.Errorf("--to: %w", err))
	}
	if err := opts.Validate(); err != nil {
		return usage(err)
	}
	if err := analytics.CheckFormat(format); err != nil {
		return usage(err)
	}
	if htmlFile != "" && list != "" {
		return usage(errors.New("--html and --list: choose one (the page holds every list)"))
	}
	if list != "" && !validList(list) {
		return usage(fmt.Errorf("--list %q: accepted: %s, %s<replay id>", list, strings.Join(analytics.ListNames(), ", "), analytics.ReplayListPrefix))
	}
	if limit < 0 {
		return usage(fmt.Errorf("--limit must be ≥ 0, got %d", limit))
	}
	if err := requireClickHouse(cfg); err != nil {
		return err
	}
	cfg, stopCH, err := analytics.LocalOrConfigured(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer stopCH()
	conn, err := cfg.Open()
	if err != nil {
		return err
	}
	defer conn.Close()
	a, err := analytics.NewAuditor(conn, cfg.Database)
	if err != nil {
		return usage(err)
	}
	if list != "" {
		rows, err := a.List(ctx, opts, list, limit)
		if err != nil {
			return err
		}
		return analytics.WriteList(stdout, rows, format)
	}
	r, err := a.Audit(ctx, opts)
	if err != nil {
		return err
	}
	if err := analytics.WriteAudit(stdout, r, format); err != nil {
		return err
	}
	if htmlFile != "" {
		if err := writeAuditHTML(ctx, a, opts, r, limit, htmlFile); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "playpipe audit: wrote %s\n", htmlFile)
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
