package testenv

import (
	"context"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Ledger is a ClickHouse a ledger test runs on, with a fresh database.
type Ledger struct {
	// Backend names the kind: "clickhouse-server" (Debian's 18.16 here, a
	// process per test) or "chdb" (current ClickHouse in-process, only in
	// test binaries built with -tags chdb).
	Backend string
	// Version is the server's SELECT version().
	Version string
	// Database is created empty for the test.
	Database string
	// Conn is a connection whose default database is Database.
	Conn driver.Conn
	// Server is the clickhouse-server of the test (nil on chdb): Addr,
	// Stop, Kill, Restart.
	Server *ClickHouse
}

// LedgerBackend starts a Ledger for a test.
type LedgerBackend struct {
	Name  string
	Start func(t testing.TB) *Ledger
}

// serverLedger is a clickhouse-server per test (StartClickHouse).
var serverLedger = LedgerBackend{Name: "clickhouse-server", Start: func(t testing.TB) *Ledger {
	t.Helper()
	ch := StartClickHouse(t)
	l := &Ledger{Backend: "clickhouse-server", Database: ch.Database, Conn: ch.Conn(t), Server: ch}
	l.Version = version(t, l.Conn)
	return l
}}

// ledgerBackends are the backends of this test binary: clickhouse-server
// always, chdb too when built with -tags chdb (ledger_chdb.go).
var ledgerBackends = []LedgerBackend{serverLedger}

// ForEachLedger runs f as a subtest per backend (named after it), each on
// a fresh database, and logs the ClickHouse version it ran on.
func ForEachLedger(t *testing.T, f func(t *testing.T, l *Ledger)) {
	t.Helper()
	for _, b := range ledgerBackends {
		t.Run(b.Name, func(t *testing.T) {
			l := b.Start(t)
			t.Logf("ledger on ClickHouse %s (%s)", l.Version, l.Backend)
			f(t, l)
		})
	}
}

func version(t testing.TB, conn driver.Conn) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(context.Background(), "SELECT version()").Scan(&v); err != nil {
		t.Fatalf("testenv: SELECT version(): %v", err)
	}
	return v
}
