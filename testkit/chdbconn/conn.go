//go:build chdb

package chdbconn

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	chproto "github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
)

// The process's one chDB session (chDB allows one per process), opened on
// first use and kept until the process exits: loading ClickHouse costs
// ~0.1–0.6 s and ~150–280 MB, once.
var sess struct {
	once    sync.Once
	conn    unsafe.Pointer // the chDB connection handle (lib.go)
	err     error
	tz      *time.Location
	version string

	mu sync.Mutex // one query at a time; guards db
	db string     // the session's current database (USE)
}

// session opens the process's chDB session (in memory: its tables live
// as long as the process).
func session() error {
	sess.once.Do(func() {
		sess.conn, sess.err = connect()
		if sess.err != nil {
			sess.err = fmt.Errorf("chdbconn: open chDB (CHDB_LIB_PATH names libchdb.so): %w", sess.err)
			return
		}
		sess.db = "default"
		// The settings a query's context carries (clickhouse.WithSettings)
		// do not reach chDB; the one the audit cannot do without is the
		// room for its constant arrays (analytics' maxQuerySize), set
		// for the session.
		if _, err := run("SET max_query_size = "+strconv.Itoa(maxQuerySize), "TabSeparated"); err != nil {
			sess.err = err
			return
		}
		out, err := run("SELECT version(), timezone()", "TabSeparated")
		if err != nil {
			sess.err = err
			return
		}
		f := strings.Split(strings.TrimSpace(string(out)), "\t")
		if len(f) != 2 {
			sess.err = fmt.Errorf("chdbconn: version and time zone: %q", out)
			return
		}
		sess.version = f[0]
		if sess.tz, err = time.LoadLocation(f[1]); err != nil {
			sess.tz = time.UTC
		}
	})
	return sess.err
}

// run executes q on the session (the caller holds sess.mu or is in
// session's once) and returns its output in format.
func run(q, format string) ([]byte, error) {
	return query(sess.conn, q, format)
}

// maxQuerySize is the session's max_query_size: analytics' (32 MiB).
const maxQuerySize = 32 << 20

// Options configure a Conn.
type Options struct {
	// Database is the default database of the Conn's queries ("default"
	// when empty).
	Database string
}

// Conn is a driver.Conn over the process's chDB session.
type Conn struct {
	db string
}

var _ driver.Conn = (*Conn)(nil)

// Open returns a Conn, opening the process's chDB session on first use.
func Open(o Options) (*Conn, error) {
	if err := session(); err != nil {
		return nil, err
	}
	if o.Database == "" {
		o.Database = "default"
	}
	return &Conn{db: o.Database}, nil
}

// Version is the ClickHouse version of the chDB library (SELECT version()).
func Version() (string, error) {
	if err := session(); err != nil {
		return "", err
	}
	return sess.version, nil
}

// exec runs q in c's default database and returns its output in format.
func (c *Conn) exec(ctx context.Context, q, format string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.db != c.db {
		if _, err := run("USE "+c.db, "TabSeparated"); err != nil {
			return nil, fmt.Errorf("chdbconn: USE %s: %w", c.db, err)
		}
		sess.db = c.db
	}
	out, err := run(q, format)
	if err != nil {
		return nil, queryError(q, err)
	}
	return out, nil
}

// Error is a query's error, as ClickHouse reported it. Like clickhouse-go's
// errors it unwraps to a *clickhouse.Exception (proto.Exception) with the
// server's code and name when chDB's message carries them ("Code: 60.
// DB::Exception: … (UNKNOWN_TABLE)"), so errors.As finds the code.
type Error struct {
	Query string
	Err   error
}

func (e *Error) Error() string { return "chdb: " + strings.TrimSpace(e.Err.Error()) }
func (e *Error) Unwrap() error { return e.Err }

var codeRE = regexp.MustCompile(`(?s)^\s*Code: (\d+)\. (?:DB::Exception: )?(.*?)(?: \(([A-Z_]+)\))?\.?\s*$`)

// queryError wraps the error chDB reported for q.
func queryError(q string, err error) *Error {
	m := codeRE.FindStringSubmatch(err.Error())
	if m == nil {
		return &Error{Query: q, Err: err}
	}
	code, _ := strconv.ParseInt(m[1], 10, 32)
	return &Error{Query: q, Err: &proto.Exception{Code: int32(code), Name: m[3], Message: m[2]}}
}

// Contributors implements driver.Conn.
func (c *Conn) Contributors() []string { return nil }

// ServerVersion implements driver.Conn: chDB's ClickHouse version.
func (c *Conn) ServerVersion() (*driver.ServerVersion, error) {
	if err := session(); err != nil {
		return nil, err
	}
	return &driver.ServerVersion{Name: "chDB", DisplayName: "chDB", Version: proto.ParseVersion(sess.version), Timezone: sess.tz}, nil
}

// Select implements driver.Conn; not supported.
func (c *Conn) Select(context.Context, any, string, ...any) error {
	return errors.New("chdbconn: Select is not supported (use Query and Scan)")
}

// Query implements driver.Conn: the whole result is read, then scanned by
// clickhouse-go's column types.
func (c *Conn) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	q, err := bind(query, args)
	if err != nil {
		return nil, err
	}
	out, err := c.exec(ctx, q, "Native")
	if err != nil {
		return nil, err
	}
	// The reader's own buffer is br (NewReader keeps a bufio.Reader of
	// its size), so br tells where the blocks end.
	br := bufio.NewReaderSize(bytes.NewReader(out), 128<<10)
	r := chproto.NewReader(br)
	var blocks []*proto.Block
	for {
		if _, err := br.Peek(1); err == io.EOF {
			break
		}
		b := &proto.Block{ServerContext: &column.ServerContext{Timezone: sess.tz}}
		if err := b.Decode(r, 0); err != nil {
			return nil, fmt.Errorf("chdbconn: decode the result of %q: %w", q, err)
		}
		blocks = append(blocks, b)
	}
	return &rows{blocks: blocks, row: -1}, nil
}

// QueryRow implements driver.Conn.
func (c *Conn) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	rs, err := c.Query(ctx, query, args...)
	return &row{rows: rs, err: err}
}

// Exec implements driver.Conn.
func (c *Conn) Exec(ctx context.Context, query string, args ...any) error {
	q, err := bind(query, args)
	if err != nil {
		return err
	}
	_, err = c.exec(ctx, q, "TabSeparated")
	return err
}

// AsyncInsert implements driver.Conn; not supported.
func (c *Conn) AsyncInsert(context.Context, string, bool, ...any) error {
	return errors.New("chdbconn: async inserts are not supported")
}

// Ping implements driver.Conn.
func (c *Conn) Ping(ctx context.Context) error {
	_, err := c.exec(ctx, "SELECT 1", "TabSeparated")
	return err
}

// Stats implements driver.Conn (no pool: zeros).
func (c *Conn) Stats() driver.Stats { return driver.Stats{} }

// Close implements driver.Conn; the process's session stays open.
func (c *Conn) Close() error { return nil }

// rows is a read result.
type rows struct {
	blocks []*proto.Block
	block  int
	row    int // in blocks[block]; -1 before the first
	err    error
}

func (r *rows) Next() bool {
	for r.block < len(r.blocks) {
		if r.row+1 < r.blocks[r.block].Rows() {
			r.row++
			return true
		}
		r.block, r.row = r.block+1, -1
	}
	return false
}

func (r *rows) Scan(dest ...any) error {
	if r.block >= len(r.blocks) || r.row < 0 {
		return errors.New("chdbconn: Scan called without a row (Next)")
	}
	b := r.blocks[r.block]
	if len(b.Columns) != len(dest) {
		return fmt.Errorf("chdbconn: expected %d destination arguments in Scan, not %d", len(b.Columns), len(dest))
	}
	for i, d := range dest {
		if err := b.Columns[i].ScanRow(d, r.row); err != nil {
			return fmt.Errorf("chdbconn: column %s: %w", b.ColumnsNames()[i], err)
		}
	}
	return nil
}

func (r *rows) ScanStruct(any) error {
	return errors.New("chdbconn: ScanStruct is not supported")
}

func (r *rows) header() *proto.Block {
	if len(r.blocks) == 0 {
		return nil
	}
	return r.blocks[0]
}

func (r *rows) ColumnTypes() []driver.ColumnType {
	h := r.header()
	if h == nil {
		return nil
	}
	out := make([]driver.ColumnType, len(h.Columns))
	for i, c := range h.Columns {
		out[i] = columnType{c}
	}
	return out
}

func (r *rows) Totals(...any) error { return sql.ErrNoRows }

func (r *rows) Columns() []string {
	if h := r.header(); h != nil {
		return h.ColumnsNames()
	}
	return nil
}

func (r *rows) Close() error  { return nil }
func (r *rows) Err() error    { return r.err }
func (r *rows) HasData() bool { return len(r.blocks) > 0 && r.blocks[0].Rows() > 0 }

type columnType struct{ c column.Interface }

func (t columnType) Name() string             { return t.c.Name() }
func (t columnType) Nullable() bool           { return strings.HasPrefix(string(t.c.Type()), "Nullable(") }
func (t columnType) ScanType() reflect.Type   { return t.c.ScanType() }
func (t columnType) DatabaseTypeName() string { return string(t.c.Type()) }

// row is QueryRow's result: like clickhouse-go's, sql.ErrNoRows without one.
type row struct {
	rows driver.Rows
	err  error
}

func (r *row) Err() error { return r.err }

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		return sql.ErrNoRows
	}
	return r.rows.Scan(dest...)
}

func (r *row) ScanStruct(any) error {
	return errors.New("chdbconn: ScanStruct is not supported")
}
