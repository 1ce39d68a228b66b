//go:build chdb

package main

import (
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/testkit/chdbconn"
)

// openChdb is the process's chDB session (CHDB_LIB_PATH names libchdb.so)
// as a connection, and its ClickHouse version.
func openChdb() (driver.Conn, error) {
	return chdbconn.Open(chdbconn.Options{})
}
