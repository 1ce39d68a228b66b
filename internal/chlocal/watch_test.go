package chlocal_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/chlocal"
)

func waitAnswer(t *testing.T, s *chlocal.Server, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := noKeepAlive.Get("http://" + s.HTTPAddr() + "/?query=SELECT%201")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server at %s did not answer within %v (last: %v)", s.HTTPAddr(), within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWatchRestartsAKilledServer: a server killed by pid from outside is
// started again by Watch on the same ports with its data; after Stop it is
// left down.
func TestWatchRestartsAKilledServer(t *testing.T) {
	s := startOrSkip(t, chlocal.Config{Dir: t.TempDir()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(ctx) }()
	defer func() { cancel(); <-done }()
	query(t, s, "CREATE TABLE default.keep (x UInt8) ENGINE = TinyLog")
	query(t, s, "INSERT INTO default.keep VALUES (7)")
	addr, pid := s.Addr(), s.PID()
	for round := range 2 {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for s.PID() == pid || !s.Running() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the killed server (pid %d) was not restarted within 30 s", round, pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
		waitAnswer(t, s, 30*time.Second)
		if s.Addr() != addr {
			t.Fatalf("restarted on %s, want the same address %s", s.Addr(), addr)
		}
		if got := query(t, s, "SELECT sum(x) FROM default.keep"); got != "7" {
			t.Fatalf("data after the restart: %q", got)
		}
		pid = s.PID()
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A negative wait: for more than Watch's recheck period nothing may
	// restart the server, so there is no condition to poll for.
	time.Sleep(1500 * time.Millisecond)
	if s.Running() {
		t.Fatal("Watch restarted a server that was stopped on purpose")
	}
}

// TestStartOnAFolderWhoseServerDiedKeepsItsPorts: the folder's server died
// (no owner to restart it): a new Start takes the recorded ports, so that
// clients of the old one reconnect, instead of new ones.
func TestStartOnAFolderWhoseServerDiedKeepsItsPorts(t *testing.T) {
	dir := t.TempDir()
	s := startOrSkip(t, chlocal.Config{Dir: dir})
	addr, httpAddr := s.Addr(), s.HTTPAddr()
	if err := syscall.Kill(s.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for s.Running() {
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(dir, "server.json")); err != nil {
		t.Fatalf("the dead server's record: %v", err)
	}
	s2 := startOrSkip(t, chlocal.Config{Dir: dir, Reuse: true})
	if !s2.Owned() || s2.Addr() != addr || s2.HTTPAddr() != httpAddr {
		t.Fatalf("restart on a dead server's folder: owned=%v %s/%s, want a new owned server on %s/%s", s2.Owned(), s2.Addr(), s2.HTTPAddr(), addr, httpAddr)
	}
	// A third process with Reuse attaches to it: same ports, not owned,
	// and the record is not rewritten.
	before, err := os.ReadFile(filepath.Join(dir, "server.json"))
	if err != nil {
		t.Fatal(err)
	}
	s3, err := chlocal.Start(context.Background(), chlocal.Config{Dir: dir, Reuse: true})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "server.json"))
	if s3.Owned() || s3.Addr() != addr || string(after) != string(before) {
		t.Fatalf("attach: owned=%v addr %s (want %s); record %s → %s", s3.Owned(), s3.Addr(), addr, before, after)
	}
}
