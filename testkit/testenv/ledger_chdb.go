//go:build chdb

package testenv

import (
	"context"
	"testing"

	"github.com/playpipe/playpipe/testkit/chdbconn"
)

// chdbLedger is current ClickHouse in this process (testkit/chdbconn):
// one chDB session per test binary, a fresh database per test, dropped
// when it ends.
var chdbLedger = LedgerBackend{Name: "chdb", Start: func(t testing.TB) *Ledger {
	t.Helper()
	db := testDatabaseName(t)
	admin, err := chdbconn.Open(chdbconn.Options{})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := admin.Exec(context.Background(), "CREATE DATABASE "+db); err != nil {
		t.Fatalf("testenv: chdb: create database %s: %v", db, err)
	}
	t.Cleanup(func() { _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) })
	conn, err := chdbconn.Open(chdbconn.Options{Database: db})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	l := &Ledger{Backend: "chdb", Database: db, Conn: conn}
	l.Version = version(t, conn)
	return l
}}

func init() { ledgerBackends = append(ledgerBackends, chdbLedger) }
