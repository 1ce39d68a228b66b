package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/internal/chlocal"
)

// ClickHouse is a ClickHouse server for one test with a fresh database.
type ClickHouse struct {
	// Addr is the native-protocol address, host:port.
	Addr string
	// Database is created empty for the test (dropped at the end on an
	// external server).
	Database string
	// User and Password authenticate (default user, no password locally).
	User, Password string

	server *chlocal.Server // nil on an external server
}

// StartClickHouse starts a local ClickHouse server in a temporary folder
// (internal/chlocal; in /dev/shm when it exists) and creates a fresh database for the test; the server is
// killed when the test ends. With PLAYPIPE_CLICKHOUSE_ADDR set it uses that
// server instead (PLAYPIPE_CLICKHOUSE_USER / _PASSWORD), where Stop and
// Restart skip the test; PLAYPIPE_CLICKHOUSE_BIN names the server binary
// to start. Without a ClickHouse binary the test is skipped,
// saying how to install one, unless PLAYPIPE_REQUIRE_CLICKHOUSE=1 (CI) makes
// that a failure.
func StartClickHouse(t testing.TB) *ClickHouse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := &ClickHouse{User: "default", Database: testDatabaseName(t)}
	if addr := os.Getenv("PLAYPIPE_CLICKHOUSE_ADDR"); addr != "" {
		c.Addr = addr
		if u := os.Getenv("PLAYPIPE_CLICKHOUSE_USER"); u != "" {
			c.User = u
		}
		c.Password = os.Getenv("PLAYPIPE_CLICKHOUSE_PASSWORD")
	} else {
		dir := clickHouseDir(t)
		s, err := chlocal.Start(ctx, chlocal.Config{Dir: dir, Binary: os.Getenv("PLAYPIPE_CLICKHOUSE_BIN")})
		if errors.Is(err, chlocal.ErrNotInstalled) && os.Getenv("PLAYPIPE_REQUIRE_CLICKHOUSE") != "1" {
			t.Skipf("testenv: %v", err)
		}
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		t.Cleanup(s.Kill) // throwaway data: no orderly shutdown needed
		c.server, c.Addr = s, s.Addr()
	}
	conn := c.open(t, "default")
	defer conn.Close()
	if err := conn.Exec(ctx, "CREATE DATABASE "+c.Database); err != nil {
		t.Fatalf("testenv: create database %s on %s: %v", c.Database, c.Addr, err)
	}
	if c.server == nil {
		t.Cleanup(func() {
			conn := c.open(t, "default")
			defer conn.Close()
			_ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+c.Database)
		})
	}
	return c
}

// clickHouseDir is the test's data folder: in RAM (/dev/shm) when possible,
// because every insert creates a part of a few dozen files, which a busy
// disk makes 30–100× slower; else the test's temp dir.
// PLAYPIPE_CLICKHOUSE_TMP chooses another parent folder.
func clickHouseDir(t testing.TB) string {
	parent := os.Getenv("PLAYPIPE_CLICKHOUSE_TMP")
	if parent == "" {
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			parent = "/dev/shm"
		}
	}
	if parent != "" {
		if dir, err := os.MkdirTemp(parent, "playpipe-clickhouse-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

func testDatabaseName(t testing.TB) string {
	var b strings.Builder
	b.WriteString("t_")
	for _, r := range strings.ToLower(t.Name()) {
		if b.Len() >= 40 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return b.String() + "_" + hex.EncodeToString(rnd[:])
}

func (c *ClickHouse) open(t testing.TB, db string) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{c.Addr},
		Auth:        clickhouse.Auth{Database: db, Username: c.User, Password: c.Password},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("testenv: clickhouse open %s: %v", c.Addr, err)
	}
	return conn
}

// Conn returns a client connection to the test's database, closed when the
// test ends.
func (c *ClickHouse) Conn(t testing.TB) driver.Conn {
	t.Helper()
	conn := c.open(t, c.Database)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Local reports whether the server is local (Stop and Restart work).
func (c *ClickHouse) Local() bool { return c.server != nil }

// Stop stops the local server in order (its data is kept) until Restart; on
// an external server the test is skipped.
func (c *ClickHouse) Stop(t testing.TB) {
	t.Helper()
	s := c.local(t, "stopping")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("testenv: stop clickhouse: %v", err)
	}
}

// Restart starts the stopped local server again on the same address and data.
func (c *ClickHouse) Restart(t testing.TB) {
	t.Helper()
	s := c.local(t, "restarting")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("testenv: restart clickhouse: %v", err)
	}
}

// local returns the local server, or skips the test (doing what needs one)
// on an external server.
func (c *ClickHouse) local(t testing.TB, doing string) *chlocal.Server {
	t.Helper()
	if c.server == nil {
		t.Skipf("testenv: %s ClickHouse needs the local server (unset PLAYPIPE_CLICKHOUSE_ADDR)", doing)
	}
	return c.server
}
