// Package chdbconn runs the ledger's SQL on current ClickHouse in-process:
// chDB (libchdb.so, ClickHouse as a library) behind clickhouse-go's
// driver.Conn, so the analytics, replay and dashboard code runs unchanged on
// it. It exists for the tests that prove the ledger's queries give the same
// numbers on ClickHouse 18.16 and on current releases (docs/audit.md,
// "Which ClickHouse versions are tested").
//
// Everything but this file is behind the build tag chdb, so only `go test
// -tags chdb` with CHDB_LIB_PATH naming the library (make test-chdb installs
// it) compiles it in. The session loads libchdb.so when it first opens and
// binds the six functions of its C API it calls with purego (lib.go); no
// chdb Go module is needed, so none reaches the module graph of a program
// that imports playpipe's libraries.
//
// What the adapter does, and how it stays faithful to clickhouse-go:
//
//   - One chDB session per process (chDB allows one), shared by every Conn,
//     queries serialised by a mutex. Each Conn has its own default database
//     (Options.Database), selected with USE before its queries.
//   - Results are read in ClickHouse's Native format and decoded by
//     clickhouse-go's own proto.Block and column types, so Scan converts
//     (and refuses) exactly as clickhouse-go does for the same column types.
//   - PrepareBatch builds clickhouse-go columns of the table's types (from
//     system.columns); rows appended to them (Append, Column(i).Append, or
//     the columns themselves) are rendered on Send as one INSERT … VALUES
//     statement naming the columns, strings with \xHH escapes so every byte
//     arrives as it was.
//   - Query arguments: positional ? placeholders with strings, integers,
//     floats, booleans and time.Time; anything else is an error.
//   - Not supported (an error): Select, ScanStruct, async inserts. A query
//     cannot be interrupted once it runs: ctx is checked before it starts.
package chdbconn
