//go:build chdb

package chdbconn

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The calls of libchdb.so's C API (chdb.h) this adapter makes, bound when
// the session opens with purego (no cgo): connect, query, the result's
// buffer, length and error, and its release. Bound here rather than
// through chdb-go, so that playpipe's module needs no chdb module (a fleet
// that imports the producer library resolves none).
var lib struct {
	// connect takes argv (argv[0] "clickhouse", then clickhouse-local's
	// options; none: an in-memory session) and returns a pointer to the
	// connection handle, nil on failure.
	connect func(argc int, argv []*byte) *unsafe.Pointer
	// query runs one query on the handle and returns its result (nil when
	// the query returned nothing).
	query   func(conn unsafe.Pointer, query, format string) unsafe.Pointer
	buffer  func(res unsafe.Pointer) *byte
	length  func(res unsafe.Pointer) uint
	errorOf func(res unsafe.Pointer) string
	destroy func(res unsafe.Pointer)
}

// bindLib loads libchdb.so (CHDB_LIB_PATH, or the loader's search path) and
// binds lib's functions.
func bindLib() (err error) {
	path := os.Getenv("CHDB_LIB_PATH")
	if path == "" {
		path = "libchdb.so"
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return fmt.Errorf("load %s: %w", path, err)
	}
	defer func() { // RegisterLibFunc panics on a missing symbol
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: %v", path, r)
		}
	}()
	purego.RegisterLibFunc(&lib.connect, h, "chdb_connect")
	purego.RegisterLibFunc(&lib.query, h, "chdb_query")
	purego.RegisterLibFunc(&lib.buffer, h, "chdb_result_buffer")
	purego.RegisterLibFunc(&lib.length, h, "chdb_result_length")
	purego.RegisterLibFunc(&lib.errorOf, h, "chdb_result_error")
	purego.RegisterLibFunc(&lib.destroy, h, "chdb_destroy_query_result")
	return nil
}

// connect opens the process's in-memory chDB session and returns its
// handle.
func connect() (unsafe.Pointer, error) {
	if err := bindLib(); err != nil {
		return nil, err
	}
	arg0 := append([]byte("clickhouse"), 0)
	c := lib.connect(1, []*byte{&arg0[0]})
	if c == nil || *c == nil {
		return nil, errors.New("chdb_connect failed")
	}
	return *c, nil
}

// query runs q on the session handle conn and returns a copy of its output
// in format (nil when the query returned nothing) or the error chDB gave.
func query(conn unsafe.Pointer, q, format string) ([]byte, error) {
	res := lib.query(conn, q, format)
	if res == nil {
		return nil, nil
	}
	defer lib.destroy(res)
	if msg := lib.errorOf(res); msg != "" {
		return nil, errors.New(msg)
	}
	buf, n := lib.buffer(res), lib.length(res)
	if buf == nil || n == 0 {
		return nil, nil
	}
	return append([]byte(nil), unsafe.Slice(buf, n)...), nil
}
