//go:build !chdb

package main

import (
	"errors"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// openChdb: this build has no chDB.
func openChdb() (driver.Conn, error) {
	return nil, errors.New("-chdb needs a build with -tags chdb and CHDB_LIB_PATH naming libchdb.so (make chdb)")
}
