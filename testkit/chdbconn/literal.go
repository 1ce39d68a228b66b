//go:build chdb

package chdbconn

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// quote is s as a ClickHouse string literal: quote and backslash escaped,
// every byte outside printable ASCII as \xHH, so any bytes (not only
// UTF-8) arrive as they were.
func quote(s string) string {
	var b strings.Builder
	quoteTo(&b, s)
	return b.String()
}

func quoteTo(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c >= 0x7f:
			b.WriteString(`\x`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
}

// literal writes v, a value of a clickhouse-go column (Row) or a query
// argument, as a ClickHouse literal.
func literal(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("NULL")
	case string:
		quoteTo(b, x)
	case []byte:
		quoteTo(b, string(x))
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int8:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int16:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int32:
		b.WriteString(strconv.FormatInt(int64(x), 10))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case uint:
		b.WriteString(strconv.FormatUint(uint64(x), 10))
	case uint8:
		b.WriteString(strconv.FormatUint(uint64(x), 10))
	case uint16:
		b.WriteString(strconv.FormatUint(uint64(x), 10))
	case uint32:
		b.WriteString(strconv.FormatUint(uint64(x), 10))
	case uint64:
		b.WriteString(strconv.FormatUint(x, 10))
	case float32:
		return literal(b, float64(x))
	case float64:
		switch {
		case math.IsNaN(x):
			b.WriteString("nan")
		case math.IsInf(x, 1):
			b.WriteString("inf")
		case math.IsInf(x, -1):
			b.WriteString("-inf")
		default:
			b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
		}
	case time.Time:
		// A DateTime column's value: its instant in whole seconds, which
		// both DateTime and a plain number accept.
		b.WriteString(strconv.FormatInt(x.Unix(), 10))
	default:
		rv := reflect.ValueOf(v)
		switch rv.Kind() {
		case reflect.Slice, reflect.Array:
			b.WriteByte('[')
			for i := 0; i < rv.Len(); i++ {
				if i > 0 {
					b.WriteString(", ")
				}
				if err := literal(b, rv.Index(i).Interface()); err != nil {
					return err
				}
			}
			b.WriteByte(']')
		case reflect.Pointer:
			if rv.IsNil() {
				b.WriteString("NULL")
				return nil
			}
			return literal(b, rv.Elem().Interface())
		default:
			return fmt.Errorf("chdbconn: no literal for a %T", v)
		}
	}
	return nil
}

// bind replaces the positional placeholders ? of query (outside string
// literals and quoted names) with args as literals.
func bind(query string, args []any) (string, error) {
	if len(args) == 0 {
		return query, nil
	}
	var b strings.Builder
	next := 0
	var quoteCh byte
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quoteCh != 0:
			b.WriteByte(c)
			if c == '\\' && i+1 < len(query) {
				i++
				b.WriteByte(query[i])
			} else if c == quoteCh {
				quoteCh = 0
			}
		case c == '\'' || c == '"' || c == '`':
			quoteCh = c
			b.WriteByte(c)
		case c == '?':
			if next >= len(args) {
				return "", fmt.Errorf("chdbconn: more placeholders than the %d arguments in %q", len(args), query)
			}
			if err := literal(&b, args[next]); err != nil {
				return "", err
			}
			next++
		default:
			b.WriteByte(c)
		}
	}
	if next != len(args) {
		return "", fmt.Errorf("chdbconn: %d arguments for %d placeholders in %q", len(args), next, query)
	}
	return b.String(), nil
}
