package chlocal_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/chlocal"
)

func query(t *testing.T, s *chlocal.Server, q string) string {
	t.Helper()
	resp, err := noKeepAlive.Post("http://"+s.HTTPAddr()+"/", "text/plain", strings.NewReader(q))
	if err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("query %q: %d %s", q, resp.StatusCode, b)
	}
	return strings.TrimSpace(string(b))
}

var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func startOrSkip(t *testing.T, opts chlocal.Config) *chlocal.Server {
	t.Helper()
	s, err := chlocal.Start(context.Background(), opts)
	if errors.Is(err, chlocal.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	return s
}

func TestStartStopRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	s := startOrSkip(t, chlocal.Config{Dir: dir})
	query(t, s, "CREATE TABLE default.t (x UInt32) ENGINE = MergeTree ORDER BY x")
	query(t, s, "INSERT INTO default.t (x) VALUES (1), (2), (3)")
	addr := s.Addr()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if _, err := http.Get("http://" + s.HTTPAddr() + "/?query=" + url.QueryEscape("SELECT 1")); err == nil {
		t.Fatal("server still answers after Stop")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Fatalf("address changed across restart: %s → %s", addr, s.Addr())
	}
	if got := query(t, s, "SELECT sum(x) FROM default.t"); got != "6" {
		t.Fatalf("data after restart: sum = %q, want 6", got)
	}
	// A crash (SIGKILL) keeps inserted data too.
	s.Kill()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := query(t, s, "SELECT count() FROM default.t"); got != "3" {
		t.Fatalf("rows after kill+start: %q, want 3", got)
	}
}

func TestReuseAttachesToRunningServer(t *testing.T) {
	dir := t.TempDir()
	s := startOrSkip(t, chlocal.Config{Dir: dir})
	s2, err := chlocal.Start(context.Background(), chlocal.Config{Dir: dir, Reuse: true})
	if err != nil {
		t.Fatal(err)
	}
	if s2.Owned() || s2.Addr() != s.Addr() {
		t.Fatalf("reuse: owned=%v addr=%s, want attached to %s", s2.Owned(), s2.Addr(), s.Addr())
	}
	if err := s2.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if query(t, s, "SELECT 1") != "1" {
		t.Fatal("attached Stop stopped the owner's server")
	}
}

func TestSecondServerOnSameFolderFails(t *testing.T) {
	dir := t.TempDir()
	startOrSkip(t, chlocal.Config{Dir: dir})
	s2, err := chlocal.Start(context.Background(), chlocal.Config{Dir: dir, StartTimeout: 10 * time.Second})
	if err == nil {
		s2.Kill()
		t.Fatal("a second server started on a folder in use")
	}
	if !strings.Contains(err.Error(), "already runs") {
		t.Fatalf("error %v: want one saying a server already runs there", err)
	}
}

func TestMissingBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Cleanup(chlocal.SetSystemDirs([]string{t.TempDir()}))
	if _, err := chlocal.FindBinary(); !errors.Is(err, chlocal.ErrNotInstalled) || !strings.Contains(err.Error(), "apt-get install -y clickhouse-server") {
		t.Fatalf("error %v: want ErrNotInstalled naming the install command", err)
	}
}

func TestBinaryOverrideMustExist(t *testing.T) {
	_, err := chlocal.Start(context.Background(), chlocal.Config{Dir: t.TempDir(), Binary: "/nonexistent/clickhouse"})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/clickhouse") {
		t.Fatalf("error %v: want one naming the binary", err)
	}
}
