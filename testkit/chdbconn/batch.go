//go:build chdb

package chdbconn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	chproto "github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
)

// insertRE is the INSERT a batch is prepared with: a table and,
// optionally, its column list (nothing after it, as for clickhouse-go).
var insertRE = regexp.MustCompile(`(?is)^\s*INSERT\s+INTO\s+([A-Za-z0-9_.]+)\s*(?:\(([^)]*)\))?\s*(?:VALUES\s*)?$`)

// PrepareBatch implements driver.Conn for `INSERT INTO [db.]table [(cols)]`:
// the batch's columns are clickhouse-go's, of the table's column types.
func (c *Conn) PrepareBatch(ctx context.Context, query string, _ ...driver.PrepareBatchOption) (driver.Batch, error) {
	m := insertRE.FindStringSubmatch(query)
	if m == nil {
		return nil, fmt.Errorf("chdbconn: PrepareBatch takes INSERT INTO table [(columns)], not %q", query)
	}
	db, table := c.db, m[1]
	if d, t, ok := strings.Cut(m[1], "."); ok {
		db, table = d, t
	}
	rs, err := c.Query(ctx, "SELECT name, type FROM system.columns WHERE database = "+quote(db)+" AND table = "+quote(table)+
		" AND default_kind NOT IN ('MATERIALIZED', 'ALIAS') ORDER BY position")
	if err != nil {
		return nil, err
	}
	types := map[string]string{}
	var all []string
	for rs.Next() {
		var name, typ string
		if err := rs.Scan(&name, &typ); err != nil {
			return nil, err
		}
		types[name] = typ
		all = append(all, name)
	}
	if len(all) == 0 {
		return nil, &Error{Query: query, Err: &proto.Exception{Code: 60, Name: "UNKNOWN_TABLE", Message: "Table " + db + "." + table + " does not exist"}}
	}
	names := all
	if m[2] != "" {
		names = nil
		for _, n := range strings.Split(m[2], ",") {
			names = append(names, strings.Trim(strings.TrimSpace(n), "`\""))
		}
	}
	b := &batch{conn: c, ctx: ctx, table: db + "." + table, names: names}
	for _, n := range names {
		typ, ok := types[n]
		if !ok {
			return nil, &Error{Query: query, Err: &proto.Exception{Code: 16, Name: "NO_SUCH_COLUMN_IN_TABLE", Message: "No such column " + n + " in table " + db + "." + table}}
		}
		col, err := column.Type(typ).Column(n, &column.ServerContext{Timezone: sess.tz})
		if err != nil {
			return nil, fmt.Errorf("chdbconn: column %s %s: %w", n, typ, err)
		}
		b.cols = append(b.cols, col)
	}
	return b, nil
}

// batch is a prepared insert: clickhouse-go columns, rendered as INSERT …
// VALUES by Send.
type batch struct {
	conn  *Conn
	ctx   context.Context
	table string
	names []string
	cols  []column.Interface
	sent  bool
}

func (b *batch) Abort() error {
	if b.sent {
		return errors.New("chdbconn: batch already sent")
	}
	b.sent = true
	return nil
}

func (b *batch) Append(v ...any) error {
	if b.sent {
		return errors.New("chdbconn: batch already sent")
	}
	if len(v) != len(b.cols) {
		return fmt.Errorf("chdbconn: %d values for %d columns", len(v), len(b.cols))
	}
	for i, c := range b.cols {
		if err := c.AppendRow(v[i]); err != nil {
			return fmt.Errorf("chdbconn: column %s: %w", c.Name(), err)
		}
	}
	return nil
}

func (b *batch) AppendStruct(any) error {
	return errors.New("chdbconn: AppendStruct is not supported")
}

func (b *batch) Column(i int) driver.BatchColumn {
	if i < 0 || i >= len(b.cols) {
		return badColumn{fmt.Errorf("chdbconn: no column %d of %d", i, len(b.cols))}
	}
	return batchColumn{b.cols[i]}
}

// Flush implements driver.Batch: rows are sent by Send.
func (b *batch) Flush() error { return nil }

func (b *batch) IsSent() bool { return b.sent }

func (b *batch) Rows() int {
	if len(b.cols) == 0 {
		return 0
	}
	return b.cols[0].Rows()
}

func (b *batch) Columns() []column.Interface { return b.cols }

func (b *batch) Close() error {
	b.sent = true
	return nil
}

// Send inserts the rows as one INSERT … VALUES naming the columns.
func (b *batch) Send() error {
	if b.sent {
		return errors.New("chdbconn: batch already sent")
	}
	b.sent = true
	n := b.Rows()
	for _, c := range b.cols {
		if c.Rows() != n {
			return fmt.Errorf("chdbconn: column %s has %d rows, column %s %d", c.Name(), c.Rows(), b.cols[0].Name(), n)
		}
	}
	if n == 0 {
		return nil
	}
	// The values as the server would receive them: each column encoded
	// as clickhouse-go sends it, decoded into a fresh column (a
	// LowCardinality column, for one, has its rows only once encoded).
	cols := make([]column.Interface, len(b.cols))
	for i, c := range b.cols {
		var err error
		if cols[i], err = roundTrip(c, n); err != nil {
			return fmt.Errorf("chdbconn: column %s: %w", c.Name(), err)
		}
	}
	var q strings.Builder
	q.WriteString("INSERT INTO " + b.table + " (" + strings.Join(b.names, ", ") + ") VALUES ")
	for r := 0; r < n; r++ {
		if r > 0 {
			q.WriteString(", ")
		}
		q.WriteByte('(')
		for i, c := range cols {
			if i > 0 {
				q.WriteString(", ")
			}
			if err := literal(&q, c.Row(r, false)); err != nil {
				return fmt.Errorf("chdbconn: column %s row %d: %w", c.Name(), r, err)
			}
		}
		q.WriteByte(')')
	}
	_, err := b.conn.exec(b.ctx, q.String(), "TabSeparated")
	return err
}

type batchColumn struct{ c column.Interface }

func (bc batchColumn) Append(v any) error {
	_, err := bc.c.Append(v)
	return err
}

func (bc batchColumn) AppendRow(v any) error { return bc.c.AppendRow(v) }

type badColumn struct{ err error }

func (bc badColumn) Append(any) error    { return bc.err }
func (bc badColumn) AppendRow(any) error { return bc.err }

// roundTrip encodes c's n rows in the native protocol's form (state prefix
// and data) and decodes them into a new column of its type.
func roundTrip(c column.Interface, n int) (column.Interface, error) {
	var buf chproto.Buffer
	if cs, ok := c.(column.CustomSerialization); ok {
		if err := cs.WriteStatePrefix(&buf); err != nil {
			return nil, err
		}
	}
	c.Encode(&buf)
	out, err := c.Type().Column(c.Name(), &column.ServerContext{Timezone: sess.tz})
	if err != nil {
		return nil, err
	}
	r := chproto.NewReader(bytes.NewReader(buf.Buf))
	if cs, ok := out.(column.CustomSerialization); ok {
		if err := cs.ReadStatePrefix(r); err != nil {
			return nil, err
		}
	}
	if err := out.Decode(r, n); err != nil {
		return nil, err
	}
	return out, nil
}
