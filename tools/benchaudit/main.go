package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/chlocal"
)

func main() {
	sizes := flag.String("sizes", "5000000,20000000,50000000", "plays per ledger, comma separated")
	days := flag.Int("days", 7, "days the plays are spread over (the day window is the last one)")
	addr := flag.String("clickhouse-addr", "", "a running server (host:port, user default); empty: start one in -dir")
	dir := flag.String("dir", "", "data folder of the started server (default: a temporary folder, removed at the end)")
	exactUpTo := flag.Int("exact-up-to", 0, "also time the exact path (--exact) on ledgers up to this many plays (0: never; at 5 M plays it needs more than the 3 GiB query limit)")
	maxMem := flag.Uint64("max-memory", 3<<30, "each audit query's max_memory_usage, bytes")
	keep := flag.Bool("keep", false, "keep the ledger databases")
	reuseDB := flag.Bool("reuse", false, "audit a ledger kept by an earlier run (-keep, same -days) instead of generating it again")
	verbose := flag.Bool("v", false, "a progress line per query on stderr")
	flag.Uint64Var(&sliceReports, "slice-reports", 0, "the audit's plays per slice (analytics.Limits.SliceReports; 0: its default)")
	flag.BoolVar(&useChdb, "chdb", false, "audit current ClickHouse in this process through chDB instead of a server (go run -tags chdb, CHDB_LIB_PATH; its queries run one at a time and take no memory limit)")
	flag.IntVar(&serverPIDFlag, "server-pid", 0, "with -clickhouse-addr: the server's pid on this machine, to sample its resident memory (else its MemoryTracking metric)")
	flag.Parse()
	if *verbose {
		progress = os.Stderr
	}
	if err := run(*sizes, *days, *addr, *dir, *exactUpTo, *maxMem, *keep, *reuseDB, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchaudit:", err)
		os.Exit(1)
	}
}

// progress gets the audit's progress lines (-v).
var progress io.Writer

// sliceReports is -slice-reports.
var sliceReports uint64

// serverPIDFlag is -server-pid.
var serverPIDFlag int

// useChdb is -chdb.
var useChdb bool

func run(sizeList string, days int, addr, dir string, exactUpTo int, maxMem uint64, keep, reuseDB bool, out io.Writer) error {
	ctx := context.Background()
	var sizes []int
	for _, s := range strings.Split(sizeList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1000 {
			return fmt.Errorf("-sizes: %q is not a number of plays ≥ 1000", s)
		}
		sizes = append(sizes, n)
	}
	pid := serverPIDFlag
	var conn driver.Conn
	if useChdb {
		c, err := openChdb()
		if err != nil {
			return err
		}
		conn, addr, pid = c, "chDB (in this process)", os.Getpid() // its memory is this process's
	} else if addr == "" {
		if dir == "" {
			d, err := os.MkdirTemp(os.Getenv("PLAYPIPE_CLICKHOUSE_TMP"), "playpipe-bench-audit-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(d)
			dir = d
		}
		s, err := chlocal.Start(ctx, chlocal.Config{Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return err
		}
		defer s.Kill()
		addr, pid = s.Addr(), serverPID(dir)
	}
	if conn == nil {
		c, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Username: "default"},
			DialTimeout: 10 * time.Second, ReadTimeout: 30 * time.Minute, MaxOpenConns: 4})
		if err != nil {
			return err
		}
		conn = c
	}
	defer conn.Close()
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		return err
	}
	fmt.Fprintf(out, "bench-audit: ClickHouse %s at %s; plays over %d days; max_memory_usage %d MiB per query\n", version, addr, days, maxMem>>20)
	fmt.Fprintf(out, "%-11s %-9s %-22s %9s %10s %11s  %s\n", "plays", "generate", "audit", "seconds", "s/M plays", "peak MiB", "figures")
	for _, n := range sizes {
		db := fmt.Sprintf("bench_audit_%d", n)
		if !keep {
			defer func() { _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) }()
		}
		start := time.Now()
		genWords := ""
		l, ok := ledgerTruth{}, false
		if reuseDB {
			l, ok = reuse(ctx, conn, db, n, days)
			genWords = "reused"
		}
		if !ok {
			if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
				return err
			}
			var err error
			if l, err = generate(ctx, conn, db, n, days); err != nil {
				return fmt.Errorf("generate %d plays: %w", n, err)
			}
			genWords = time.Since(start).Round(time.Second).String()
		}
		day := l
		day.from = l.to.Add(-24 * time.Hour)
		cases := []struct {
			name  string
			w     ledgerTruth
			exact bool
			list  bool
		}{
			{"audit, whole window", l, false, false},
			{"audit, last day", day, false, false},
			{"--list delivered-twice, whole", l, false, true},
			{"--list delivered-twice, day", day, false, true},
		}
		if n <= exactUpTo {
			cases = append(cases, struct {
				name  string
				w     ledgerTruth
				exact bool
				list  bool
			}{"audit --exact, whole", l, true, false})
		}
		for i, c := range cases {
			a, err := analytics.NewAuditor(conn, db)
			if err != nil {
				return err
			}
			a.SetLimits(analytics.Limits{MaxMemory: maxMem, Exact: c.exact, QueryTimeout: 10 * time.Minute, Progress: progress, SliceReports: sliceReports})
			o := analytics.AuditOptions{From: c.w.from, To: c.w.to, Now: c.w.now, PendingThreshold: 10 * time.Minute}
			peak := sampler(ctx, conn, pid)
			t0 := time.Now()
			verdict := "ok"
			if c.list {
				rows, err := a.List(ctx, o, "delivered-twice", 0)
				switch {
				case err != nil:
					verdict = "FAILED: " + err.Error()
				case uint64(len(rows)) != c.w.truth().twice:
					verdict = fmt.Sprintf("WRONG: %d rows, seeded %d", len(rows), c.w.truth().twice)
				}
			} else {
				r, err := a.Audit(ctx, o)
				if err != nil {
					verdict = "FAILED: " + err.Error()
				} else {
					verdict = c.w.check(r)
				}
			}
			took := time.Since(t0)
			p := peak()
			g := ""
			if i == 0 {
				g = genWords
			}
			fmt.Fprintf(out, "%-11d %-9s %-22s %9.2f %10.2f %11d  %s\n", n, g, c.name, took.Seconds(), took.Seconds()/(float64(n)/1e6), p>>20, verdict)
		}
	}
	return nil
}

// serverPID is the pid chlocal recorded for the server in dir.
func serverPID(dir string) int {
	b, err := os.ReadFile(dir + "/server.json")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.Index(s, `"pid":`)
	if i < 0 {
		return 0
	}
	s = s[i+len(`"pid":`):]
	j := strings.IndexAny(s, ",}")
	n, _ := strconv.Atoi(strings.TrimSpace(s[:j]))
	return n
}

// sampler samples the server's memory every 50 ms until the returned
// function is called, which returns the peak in bytes: the resident set
// of pid (when known), else the server's MemoryTracking metric.
func sampler(ctx context.Context, conn driver.Conn, pid int) func() uint64 {
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			var v uint64
			if pid > 0 {
				v = rss(pid)
			} else {
				var m int64
				if conn.QueryRow(ctx, "SELECT value FROM system.metrics WHERE metric = 'MemoryTracking'").Scan(&m) == nil && m > 0 {
					v = uint64(m)
				}
			}
			if v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(stop)
		wg.Wait()
		return peak.Load()
	}
}

// rss is the resident set of pid in bytes (VmRSS), 0 when unknown.
func rss(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if f := strings.Fields(ln); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
